---@class kode.Keys
---Keys work in Insert mode while a suggestion shows; otherwise the key does what it did
---before (its previous mapping, or the key itself). `false` leaves a key unmapped.
---@field accept string|false Accept the whole suggestion.
---@field accept_line string|false Accept up to the end of the suggestion's current line.
---@field accept_word string|false Accept the next word.
---@field dismiss string|false Hide the suggestion and cancel its request.
---@field next_edit string|false Normal and Insert mode, while a next edit shows (and no
---  suggestion, completion menu or snippet jump wants the key): jump to it, then apply it.

---@class kode.Config
---@field cmd? string[] The server command (`kode lsp`); nil: the server :KodeInstall installed,
---  else `kode` on PATH.
---@field settings table<string, any> Server settings (camelCase), sent as `initializationOptions`;
---  see editors/README.md. Unset keys take the server's defaults.
---@field filetypes? string[] Attach to these filetypes only; nil: every buffer backed by a file.
---@field root_markers? string[] Files that mark a project root (for `root_dir`); nil: none.
---@field debounce_ms integer Ask for a suggestion this long after the last keystroke.
---@field builtin? boolean Use `vim.lsp.inline_completion` (Neovim >= 0.12) instead of Kode's
---  own ghost text; nil: when available. The built-in UI does not show streamed partials.
---@field keys kode.Keys
---@field hl_group string Highlight group of the ghost text (linked to `Comment` by default).
---@field next_edits? boolean Show next edits (`kode/inlineEdit`): sets `settings.nextEdits`
---  unless that is set; nil: as `settings.nextEdits` (off by default).
---@field next_edit_debounce_ms integer Ask for the next edit this long after the last change.
local defaults = {
  cmd = nil,
  settings = {},
  filetypes = nil,
  root_markers = nil,
  debounce_ms = 75,
  builtin = nil,
  keys = {
    accept = "<Tab>",
    accept_line = "<C-l>",
    accept_word = "<C-Right>",
    dismiss = "<C-]>",
    next_edit = "<Tab>",
  },
  hl_group = "KodeGhostText",
  next_edits = nil,
  next_edit_debounce_ms = 250,
}

local M = {}

---@type kode.Config
M.options = vim.deepcopy(defaults)

--- Whether `cmd` was given to setup() (else it is chosen, and :KodeInstall may change it).
M.cmd_configured = false

---@param opts? kode.Config|table
---@return kode.Config
function M.setup(opts)
  M.options = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts or {})
  local o = M.options
  M.cmd_configured = o.cmd ~= nil
  o.cmd = o.cmd or require("kode.install").command()
  if o.builtin == nil then
    o.builtin = vim.lsp.inline_completion ~= nil
  end
  -- Kode's own ghost text grows with the streamed text; the built-in UI cannot.
  if o.settings.partialCompletions == nil then
    o.settings.partialCompletions = not o.builtin
  end
  -- Next edits: the plugin's option is the server's setting (kode.next_edit reads it).
  if o.settings.nextEdits == nil and o.next_edits ~= nil then
    o.settings.nextEdits = o.next_edits
  end
  return o
end

---@return kode.Config
function M.defaults()
  return vim.deepcopy(defaults)
end

return M
