"""Next edits (issue 49): what the user just changed (``history``) and the edit they
will most likely make next without a model (``repeat``)."""
