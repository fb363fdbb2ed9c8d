"""What Kode knows of the project around a document: the workspace index (``workspace``,
``workspace_files``, its parsing child ``index_worker``), project context for prompts
(``retrieval``, ``outline``), the names monitor's analysis (``members``, ``receivers``),
and their owner for one engine (``context.ProjectContext``)."""
