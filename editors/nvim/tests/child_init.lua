-- Init file of the Neovim that tests/run.lua drives over RPC (`nvim --embed -u this`).
-- Loads the plugin from this checkout, sets it up against the real server (KODE_BIN,
-- small model) and records the plugin's events for the runner to inspect.

local root = assert(vim.env.KODE_NVIM_ROOT, "KODE_NVIM_ROOT is not set")
vim.opt.runtimepath:prepend(root)
vim.o.swapfile = false
vim.o.hidden = true
vim.o.expandtab = true
vim.o.shiftwidth = 4
vim.o.softtabstop = 4
vim.cmd("filetype on")

-- A mapping made before Kode: with no suggestion showing, <C-l> must still do this.
vim.keymap.set("i", "<C-l>", "PREV")

_G.kode_events = {}
vim.api.nvim_create_autocmd("User", {
  pattern = {
    "KodeRequest",
    "KodeResponse",
    "KodePartial",
    "KodeCancel",
    "KodeNextEditRequest",
    "KodeNextEditResponse",
    "KodeNextEditCancel",
  },
  callback = function(args)
    table.insert(_G.kode_events, { event = args.match, data = args.data })
  end,
})
vim.api.nvim_create_autocmd("ModeChanged", {
  callback = function()
    table.insert(_G.kode_events, { event = "ModeChanged", data = { mode = vim.v.event.old_mode .. ">" .. vim.v.event.new_mode } })
  end,
})
vim.api.nvim_create_autocmd("LspRequest", {
  callback = function(args)
    local request = args.data.request
    if request.method == "textDocument/inlineCompletion" then
      table.insert(_G.kode_events, { event = "LspRequest", data = { id = args.data.request_id, type = request.type } })
    end
  end,
})

-- Small and short: the tests share two slow cores with the server.
-- engineIdleMinutes 0: the shared engine ends with the test's Neovim, not 30 minutes later.
local BASE_SETTINGS = { model = "small", maxTokens = 48, snippetTokens = 0, engineIdleMinutes = 0 }

require("kode").setup({
  cmd = { vim.env.KODE_BIN or "kode", "lsp" },
  settings = vim.deepcopy(BASE_SETTINGS),
  debounce_ms = 30,
})

-- Helpers the runner calls through nvim_exec_lua.
local T = {}
_G.T = T

--- The ghost text as drawn: inline virt_text, then virt_lines, joined by newlines.
function T.ghost()
  local ns = require("kode.ghost").ns
  local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  if #marks == 0 then
    return vim.NIL
  end
  assert(#marks == 1, "more than one ghost-text extmark")
  local details = marks[1][4]
  local lines = { details.virt_text and details.virt_text[1][1] or "" }
  for _, chunks in ipairs(details.virt_lines or {}) do
    lines[#lines + 1] = chunks[1][1]
  end
  return { row = marks[1][2], col = marks[1][3], text = table.concat(lines, "\n") }
end

function T.open(path, lines)
  vim.cmd("stopinsert")
  vim.cmd.edit({ vim.fn.fnameescape(path), bang = true })
  vim.api.nvim_buf_set_lines(0, 0, -1, false, lines)
end

function T.ready()
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = 0, name = "kode" })) do
    if client.initialized then
      return true
    end
  end
  return false
end

function T.buffer()
  local pos = vim.api.nvim_win_get_cursor(0)
  return {
    text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n"),
    row = pos[1] - 1,
    col = pos[2],
    mode = vim.api.nvim_get_mode().mode,
  }
end

function T.stats()
  local client = vim.lsp.get_clients({ name = "kode" })[1]
  local response = assert(client:request_sync("kode/stats", vim.empty_dict(), 10000))
  assert(not response.err, vim.inspect(response.err))
  return response.result
end

--- Answer the in-flight request with `text` instead of the model (and cancel the real
--- one). If the real answer already came, ask again first, so the result does not depend
--- on how fast the server is.
function T.craft(text)
  local completion = require("kode.completion")
  if not completion.pending() then
    completion.dismiss()
    completion.request()
  end
  local req = completion.pending()
  if not req or not req.id then
    return false
  end
  vim.lsp.get_client_by_id(req.client_id):cancel_request(req.id)
  completion._on_response(req, nil, { items = { { insertText = text } } }, {
    method = completion.METHOD,
    client_id = req.client_id,
    bufnr = req.buf,
    version = req.version,
  })
  return true
end

--- Deliver a `kode/inlineCompletionPartial` as the server would (through the client's handler).
function T.partial(overrides)
  local completion = require("kode.completion")
  local req = assert(completion.pending(), "no request in flight")
  local client = assert(vim.lsp.get_client_by_id(req.client_id))
  local params = vim.tbl_extend("force", {
    requestId = req.id,
    textDocument = { uri = vim.uri_from_bufnr(req.buf), version = req.version },
    position = { line = req.row, character = req.col },
    text = "",
  }, overrides)
  client.handlers["kode/inlineCompletionPartial"](nil, params, {
    method = "kode/inlineCompletionPartial",
    client_id = client.id,
  })
end

function T.set_settings(settings)
  local options = require("kode.config").options
  options.settings = vim.tbl_extend("force", vim.deepcopy(BASE_SETTINGS), settings or {})
  options.settings.partialCompletions = true
  require("kode.lsp").notify_settings(options.settings)
end

-- The next-edit tests' in-process server (a fake "kode"; see fake_server.lua).
_G.F = dofile(root .. "/tests/fake_server.lua")
