-- Init file of the Neovim that tests/test_real_neovim.py runs in a real terminal (tmux):
-- the plugin from this checkout against the real `kode lsp` (KODE_BIN) with the small
-- model, set up the way a user would, plus a status line and a fixed ghost-text colour so
-- that the test can tell ghost text from typed text in `tmux capture-pane -e`.

local root = assert(vim.env.KODE_NVIM_ROOT, "KODE_NVIM_ROOT is not set")
vim.opt.runtimepath:prepend(root)
vim.o.swapfile = false
vim.o.shadafile = "NONE"
vim.o.termguicolors = true
vim.o.number = true
vim.o.laststatus = 2
vim.o.showmode = true
vim.o.expandtab = true
vim.o.shiftwidth = 4
vim.o.softtabstop = 4
vim.cmd("filetype plugin indent on")
vim.cmd("syntax on")

-- The server's log (warnings and errors) goes to KODE_LOG_FILE for the test to show.
local cmd = { vim.env.KODE_BIN or "kode", "lsp" }
if vim.env.KODE_LOG_FILE then
  vim.list_extend(cmd, { "--log-file", vim.env.KODE_LOG_FILE })
end

require("kode").setup({
  cmd = cmd,
  -- Greedy and short: the same text every run, and quick on two cores shared with the
  -- test and other work (one llama.cpp thread: threads that wait on each other on busy
  -- cores slow decoding down sharply).
  -- KODE_TEST_DEFAULTS=1 (the README's pictures): Kode as a user gets it.
  settings = vim.env.KODE_TEST_DEFAULTS == "1" and { engineIdleMinutes = 0 } or {
    model = "small",
    maxTokens = 24,
    temperature = 0,
    snippetTokens = 0,
    threads = 1,
    speculation = "none",
    engineIdleMinutes = 0, -- the shared engine ends with the test's Neovim
  },
  debounce_ms = tonumber(vim.env.KODE_DEBOUNCE_MS or "75"),
  -- The next-edit test turns next edits on (settings.nextEdits) as a user would.
  next_edits = vim.env.KODE_NEXT_EDITS == "1",
})
-- The test finds ghost text on screen by this colour (a grey like Comment's).
vim.api.nvim_set_hl(0, "KodeGhostText", { fg = "#8b95a7", italic = true })
-- And a next edit by these: what goes (struck through) and what comes.
vim.api.nvim_set_hl(0, "KodeNextEditDelete", { fg = "#e06c75", strikethrough = true })
vim.api.nvim_set_hl(0, "KodeNextEditInsert", { fg = "#98c379", bold = true })
vim.o.statusline = "%f %m%=%{v:lua.require'kode'.statusline()} "

-- For the test, over `nvim --server ... --remote-expr`: the buffer and the ghost text.
_G.KodeTerminal = {}

function KodeTerminal.state()
  local ns = require("kode.ghost").ns
  local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  local ghost = vim.NIL
  if #marks > 0 then
    local details = marks[1][4]
    local lines = { details.virt_text and details.virt_text[1][1] or "" }
    for _, chunks in ipairs(details.virt_lines or {}) do
      lines[#lines + 1] = chunks[1][1]
    end
    ghost = { row = marks[1][2], col = marks[1][3], text = table.concat(lines, "\n") }
  end
  local ready = false
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = 0, name = "kode" })) do
    ready = ready or client.initialized
  end
  -- The next edit as drawn: the struck-through span and the text shown to come.
  local next_edit = vim.NIL
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, require("kode.next_edit").ns, 0, -1, { details = true })) do
    local d = m[4]
    next_edit = next_edit == vim.NIL and {} or next_edit
    if d.hl_group == "KodeNextEditDelete" then
      next_edit.struck = { m[2], m[3], d.end_row, d.end_col }
    elseif d.virt_text then
      next_edit.insert = { row = m[2], col = m[3], text = d.virt_text[1][1] }
    end
  end
  local pos = vim.api.nvim_win_get_cursor(0)
  return vim.json.encode({
    next_edit = next_edit,
    ready = ready,
    mode = vim.api.nvim_get_mode().mode,
    lines = vim.api.nvim_buf_get_lines(0, 0, -1, false),
    row = pos[1] - 1,
    col = pos[2],
    ghost = ghost,
    pending = require("kode.completion").pending() ~= nil,
  })
end

-- The plugin's events, for the test's explanation of a failure.
local events = {}
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
    events[#events + 1] = { event = args.match, data = args.data }
    if #events > 20 then
      table.remove(events, 1)
    end
  end,
})

function KodeTerminal.events()
  return vim.json.encode(events)
end

-- The server's `kode/stats` (JSON), asked synchronously: what the server has counted.
function KodeTerminal.stats()
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = 0, name = "kode" })) do
    local reply = client:request_sync("kode/stats", vim.empty_dict(), 5000, 0)
    if reply and reply.result then
      return vim.json.encode(reply.result)
    end
  end
  return ""
end
