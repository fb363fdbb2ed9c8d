--- The `kode` LSP config: server command, settings as initializationOptions, handlers.
local M = {}

M.NAME = "kode"
M.PARTIAL_METHOD = "kode/inlineCompletionPartial"

--- An empty Lua table would be sent as a JSON array; the server wants an object.
---@param settings table
function M.as_object(settings)
  return vim.tbl_isempty(settings) and vim.empty_dict() or settings
end

---@param o kode.Config
function M.setup(o)
  local completion = require("kode.completion")
  vim.lsp.config(M.NAME, {
    cmd = o.cmd,
    filetypes = o.filetypes,
    root_markers = o.root_markers,
    init_options = M.as_object(o.settings),
    handlers = {
      [M.PARTIAL_METHOD] = function(...)
        if not o.builtin then
          completion.on_partial(...)
        end
      end,
    },
  })
  if vim.fn.executable(o.cmd[1]) == 1 then
    vim.lsp.enable(M.NAME)
  else
    -- Starting it would fail in every buffer; :KodeInstall enables it once installed.
    -- One short line: a message wider than the screen waits for Enter at startup.
    local how = require("kode.config").cmd_configured and "set cmd" or "run :KodeInstall, or set cmd"
    vim.notify(("Kode: no server (%s not found): %s"):format(o.cmd[1], how), vim.log.levels.WARN)
  end
  if o.builtin then
    vim.api.nvim_create_autocmd("LspAttach", {
      group = vim.api.nvim_create_augroup("kode.lsp", { clear = true }),
      callback = function(args)
        local client = vim.lsp.get_client_by_id(args.data.client_id)
        if client and client.name == M.NAME then
          vim.lsp.inline_completion.enable(completion.is_enabled(), { client_id = client.id })
        end
      end,
    })
  else
    completion.attach_autocmds()
  end
end

---@return vim.lsp.Client[]
function M.clients()
  return vim.lsp.get_clients({ name = M.NAME })
end

--- Send the full settings object again (`workspace/didChangeConfiguration`).
---@param settings table
function M.notify_settings(settings)
  for _, client in ipairs(M.clients()) do
    client:notify("workspace/didChangeConfiguration", { settings = { kode = M.as_object(settings) } })
  end
end

return M
