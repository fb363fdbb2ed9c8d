--- Next edits (`kode/inlineEdit`, docs/protocol.md): the edit the user will likely make
--- next (after renaming a name at one use, the same rename at the next use), which may lie
--- away from the cursor and span lines.
---
---   text change -> hide the edit + cancel the request in flight -> pause -> request
---   reply -> checked against the document version it was asked for -> extmarks: what
---   goes struck through (KodeNextEditDelete), what comes as virtual text or lines
---   (KodeNextEditInsert); hidden while a completion's ghost text shows (it wins)
---   <Tab> (keys.lua) -> jump to the edit; <Tab> there -> apply it, one undo step
---   <Esc> in Normal mode, any edit, leaving the buffer -> dismiss
---
--- On while `settings.nextEdits` is (setup option `next_edits`) and completions are on.
--- Events for statuslines and tests: `User KodeNextEditRequest` (data: id, buf, version),
--- `User KodeNextEditResponse` (data: id, status = shown|empty|stale|error),
--- `User KodeNextEditCancel` (data: id).
local inflight = require("kode.inflight")
local config = require("kode.config")
local completion = require("kode.completion")

local M = {}

M.METHOD = "kode/inlineEdit"
M.ns = vim.api.nvim_create_namespace("kode.next_edit")
M.DELETE_HL = "KodeNextEditDelete"
M.INSERT_HL = "KodeNextEditInsert"

local ESC = vim.api.nvim_replace_termcodes("<Esc>", true, false, true)

---@class kode.EditRequest
---@field id? integer JSON-RPC id
---@field client_id integer
---@field buf integer
---@field version integer document version sent with the request (util.buf_versions)
---@field manual boolean asked by :KodeNextEdit (the answer is told)

---@class kode.NextEdit
---@field buf integer
---@field version integer the document version it was made for
---@field srow integer 0-based start row
---@field scol integer 0-based start byte column
---@field erow integer
---@field ecol integer
---@field text string what replaces the range
---@field landed? integer[] where <Tab> put the cursor (0-based row, col)

local state = {
  ---@type kode.EditRequest?
  request = nil,
  ---@type kode.NextEdit?
  edit = nil,
  drawn = false, -- the edit's extmarks are on screen (not hidden by ghost text)
  asked = nil, ---@type { buf: integer, version: integer }? the last document version asked about
  timer = nil, ---@type uv.uv_timer_t?
}

local emit = inflight.emit

local function cursor()
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function version(buf)
  return vim.lsp.util.buf_versions[buf]
end

--- Next edits are asked for: the server setting is on, and so are completions.
---@return boolean
function M.enabled()
  return config.options.settings.nextEdits == true and completion.is_enabled()
end

--- The edit still stands for its buffer's text.
---@param e kode.NextEdit
local function current(e)
  return vim.api.nvim_buf_is_valid(e.buf) and version(e.buf) == e.version
end

--- Cancel the request in flight, if any ($/cancelRequest; its answer is then dropped).
function M.cancel()
  inflight.cancel(state, "KodeNextEditCancel")
end

--- Statuslines show M.hint(): redraw them when it changes.
local function set_drawn(drawn)
  if state.drawn ~= drawn then
    state.drawn = drawn
    vim.cmd.redrawstatus()
  end
end

local function erase()
  local e = state.edit
  if e and vim.api.nvim_buf_is_valid(e.buf) then
    vim.api.nvim_buf_clear_namespace(e.buf, M.ns, 0, -1)
  end
  set_drawn(false)
end

--- Hide the next edit (its request, if any, goes on).
function M.clear()
  erase()
  state.edit = nil
end

--- Hide the next edit and cancel its request. Returns whether one was shown.
---@return boolean
function M.dismiss()
  local shown = state.drawn
  M.clear()
  M.cancel()
  return shown
end

--- Virtual text shows a tab as one cell; draw it as the spaces it would take.
local function display(s, buf)
  return (s:gsub("\t", string.rep(" ", vim.bo[buf].tabstop)))
end

--- Draw the edit, unless a completion's ghost text shows (the completion wins at the
--- cursor; the edit comes back when the ghost text goes).
function M.render()
  erase()
  local e = state.edit
  if not e or not current(e) or completion.visible() then
    return
  end
  if e.srow ~= e.erow or e.scol ~= e.ecol then
    vim.api.nvim_buf_set_extmark(e.buf, M.ns, e.srow, e.scol, {
      end_row = e.erow,
      end_col = e.ecol,
      hl_group = M.DELETE_HL,
      priority = 200,
    })
  end
  -- What comes: its first line inline where the range ends, the others as lines below.
  local lines = vim.split(e.text, "\n", { plain = true })
  -- hl_mode "replace": inline text at the end of the struck range would be struck too.
  local opts = { priority = 200, hl_mode = "replace" }
  if lines[1] ~= "" then
    opts.virt_text = { { display(lines[1], e.buf), M.INSERT_HL } }
    opts.virt_text_pos = "inline"
  end
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do
      opts.virt_lines[#opts.virt_lines + 1] = { { display(lines[i], e.buf), M.INSERT_HL } }
    end
  end
  if opts.virt_text or opts.virt_lines then
    vim.api.nvim_buf_set_extmark(e.buf, M.ns, e.erow, e.ecol, opts)
  end
  set_drawn(true)
end

--- The next edit drawn in the current buffer, or nil.
---@return kode.NextEdit?
function M.shown()
  local e = state.edit
  if state.drawn and e and e.buf == vim.api.nvim_get_current_buf() and current(e) then
    return e
  end
end

---@return kode.EditRequest?
function M.pending()
  return state.request
end

--- A completion menu is open (the built-in popup menu, nvim-cmp, blink.cmp).
---@return boolean
function M.menu_visible()
  if vim.fn.pumvisible() == 1 then
    return true
  end
  for _, probe in ipairs({
    { "cmp", "visible" },
    { "blink.cmp", "is_visible" },
  }) do
    local mod = package.loaded[probe[1]]
    if type(mod) == "table" and type(mod[probe[2]]) == "function" then
      local ok, visible = pcall(mod[probe[2]])
      if ok and visible then
        return true
      end
    end
  end
  return false
end

--- A snippet can jump forward (vim.snippet, LuaSnip).
---@return boolean
function M.snippet_active()
  if vim.snippet and vim.snippet.active({ direction = 1 }) then
    return true
  end
  local luasnip = package.loaded["luasnip"]
  if type(luasnip) == "table" and type(luasnip.locally_jumpable) == "function" then
    local ok, jumpable = pcall(luasnip.locally_jumpable, 1)
    return ok and jumpable == true
  end
  return false
end

--- <Tab> is the next edit's: one is drawn, and no completion menu or snippet wants it.
---@return boolean
function M.tab_ready()
  return M.shown() ~= nil and not M.menu_visible() and not M.snippet_active()
end

--- LSP position -> 0-based (row, byte column) of `buf`, or nil if outside it. The line
--- just past the last one is the end of the last.
---@return integer?, integer?
local function byte_position(buf, pos, encoding)
  if type(pos) ~= "table" or type(pos.line) ~= "number" or type(pos.character) ~= "number" then
    return nil
  end
  local count = vim.api.nvim_buf_line_count(buf)
  if pos.line < 0 or pos.line > count or pos.character < 0 then
    return nil
  end
  if pos.line == count then
    local last = vim.api.nvim_buf_get_lines(buf, count - 1, count, true)[1]
    return count - 1, #last
  end
  local line = vim.api.nvim_buf_get_lines(buf, pos.line, pos.line + 1, true)[1]
  return pos.line, vim.str_byteindex(line, encoding, pos.character, false)
end

--- One edit of the answer as a kode.NextEdit of `buf`, or nil if it does not fit there.
---@param buf integer
---@param edit table {textDocument, range, text}
---@param encoding string the client's offset encoding
---@return kode.NextEdit?
local function to_next_edit(buf, edit, encoding)
  if type(edit) ~= "table" or type(edit.text) ~= "string" or type(edit.range) ~= "table" then
    return nil
  end
  local doc = edit.textDocument
  if type(doc) == "table" and doc.uri ~= nil and doc.uri ~= vim.uri_from_bufnr(buf) then
    return nil -- another document: not shown here
  end
  local srow, scol = byte_position(buf, edit.range.start, encoding)
  local erow, ecol = byte_position(buf, edit.range["end"], encoding)
  if not srow or not erow or erow < srow or (erow == srow and ecol < scol) then
    return nil
  end
  local text = edit.text
  if edit.range["end"].line == vim.api.nvim_buf_line_count(buf) then
    -- Through the last line's newline, which the buffer keeps itself ('eol'): the new
    -- text's own last newline goes; deleted whole lines take the newline before them.
    if text:sub(-1) == "\n" then
      text = text:sub(1, -2)
    elseif text == "" and scol == 0 and srow > 0 then
      srow = srow - 1
      scol = #vim.api.nvim_buf_get_lines(buf, srow, srow + 1, true)[1]
    end
  end
  local old = table.concat(vim.api.nvim_buf_get_text(buf, srow, scol, erow, ecol, {}), "\n")
  if old == text then
    return nil -- changes nothing
  end
  return { buf = buf, version = version(buf), srow = srow, scol = scol, erow = erow, ecol = ecol, text = text }
end

local function tell(req, msg, level)
  if req.manual then
    vim.notify("Kode: " .. msg, level or vim.log.levels.INFO)
  end
end

--- The answer to `req`. Exposed for tests (`_on_response`) to feed crafted answers.
---@param req kode.EditRequest
---@param err? lsp.ResponseError
---@param result? { edits: table[] }
---@param ctx? lsp.HandlerContext
function M._on_response(req, err, result, ctx)
  if state.request ~= req then
    return -- cancelled or superseded meanwhile
  end
  state.request = nil
  local function done(status)
    emit("KodeNextEditResponse", { id = req.id, status = status })
  end
  if err then
    tell(req, "next edit failed: " .. tostring(err.message or err.code), vim.log.levels.WARN)
    return done("error")
  end
  local now = vim.api.nvim_buf_is_valid(req.buf) and version(req.buf) or nil
  if now ~= req.version or (ctx and ctx.version ~= nil and ctx.version ~= req.version) then
    return done("stale")
  end
  local client = vim.lsp.get_client_by_id(req.client_id)
  local edits = client and type(result) == "table" and type(result.edits) == "table" and result.edits or {}
  for _, raw in ipairs(edits) do
    local doc = type(raw) == "table" and raw.textDocument or nil
    if type(doc) == "table" and doc.version ~= nil and doc.version ~= now then
      return done("stale") -- made for a document version the buffer has left
    end
    local edit = to_next_edit(req.buf, raw, client.offset_encoding)
    if edit then
      erase()
      state.edit = edit
      M.render()
      return done("shown")
    end
  end
  tell(req, "no next edit here")
  done("empty")
end

--- Ask for the next edit at the cursor now.
---@param manual? boolean asked by hand: tell what came of it
---@return boolean sent
function M.request(manual)
  local buf = vim.api.nvim_get_current_buf()
  local client = completion.client(buf)
  if not client then
    if manual then
      vim.notify("Kode: no kode server runs for this buffer", vim.log.levels.WARN)
    end
    return false
  end
  M.cancel()
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding) --[[@as table]]
  -- util.buf_versions moves on with every change, before the (debounced) didChange that
  -- client:request flushes first: the version the server will have.
  local v = version(buf)
  params.textDocument.version = v
  ---@type kode.EditRequest
  local req = { client_id = client.id, buf = buf, version = v, manual = manual == true }
  state.request = req
  state.asked = { buf = buf, version = v }
  local ok, id = client:request(M.METHOD, params, function(err, result, ctx)
    M._on_response(req, err, result, ctx)
  end, buf)
  if not ok or not id then
    if state.request == req then
      state.request = nil
    end
    return false
  end
  req.id = id
  emit("KodeNextEditRequest", { id = id, buf = buf, version = v })
  return true
end

--- `:KodeNextEdit`: ask now, and say when there is none.
function M.ask()
  if config.options.settings.nextEdits ~= true then
    return vim.notify(
      'Kode: next edits are off; turn them on with require("kode").setup({ next_edits = true })',
      vim.log.levels.WARN
    )
  end
  M.dismiss()
  M.request(true)
end

--- The text of `buf` changed (TextChanged, TextChangedI): hide the edit, cancel the
--- request, and ask again after the pause.
---@param buf integer
function M.on_change(buf)
  local v = version(buf)
  local e, asked = state.edit, state.asked
  if (e and e.buf == buf and e.version == v) or (asked and asked.buf == buf and asked.version == v) then
    return -- nothing changed since (TextChanged after leaving Insert mode reports it again)
  end
  M.dismiss()
  if not M.enabled() or not completion.client(buf) then
    return
  end
  inflight.debounce(state, config.options.next_edit_debounce_ms, function()
    if vim.api.nvim_get_current_buf() == buf and M.enabled() then
      M.request(false)
    end
  end)
end

--- Move the cursor to the edit's start.
---@param e kode.NextEdit
local function jump(e)
  local insert = vim.api.nvim_get_mode().mode:sub(1, 1) == "i"
  if not insert then
    vim.cmd("normal! m'") -- <C-o> comes back
  end
  vim.api.nvim_win_set_cursor(0, { e.srow + 1, e.scol })
  if not insert then
    vim.cmd("normal! zv") -- open a fold it is in
  end
  local row, col = cursor()
  e.landed = { row, col }
  if insert then
    completion.hold() -- no completion at the place the cursor went to show the edit
  end
end

--- Apply the edit as one undo step; the cursor goes to the end of the new text.
---@param e kode.NextEdit
local function apply(e)
  M.dismiss()
  local lines = vim.split(e.text, "\n", { plain = true })
  -- Setting 'undolevels' closes the undo step: the edit is undone alone, not with the
  -- text typed before it, and text typed after it is not undone with it.
  vim.o.undolevels = vim.o.undolevels
  vim.api.nvim_buf_set_text(e.buf, e.srow, e.scol, e.erow, e.ecol, lines)
  vim.o.undolevels = vim.o.undolevels
  local row = e.srow + #lines - 1
  local col = (#lines == 1 and e.scol or 0) + #lines[#lines]
  if vim.api.nvim_get_mode().mode:sub(1, 1) ~= "i" and col > 0 then
    col = col - 1 -- Normal mode: on the last character
  end
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
end

--- <Tab>: jump to the next edit; where <Tab> put the cursor (or at its start), apply it.
---@return boolean acted
function M.tab()
  local e = M.shown()
  if not e then
    return false
  end
  local row, col = cursor()
  local at_start = row == e.srow and col == e.scol
  local landed = e.landed and row == e.landed[1] and col == e.landed[2]
  if at_start or landed then
    apply(e)
  else
    jump(e)
  end
  return true
end

--- "next edit: line 12" while one is drawn, for statuslines; nil otherwise.
---@return string?
function M.hint()
  local e = M.shown()
  return e and ("next edit: line %d"):format(e.srow + 1) or nil
end

function M.highlights()
  vim.api.nvim_set_hl(0, M.DELETE_HL, { link = "@markup.strikethrough", default = true })
  vim.api.nvim_set_hl(0, M.INSERT_HL, { link = "DiffAdd", default = true })
end

function M.setup()
  M.highlights()
  local group = vim.api.nvim_create_augroup("kode.next_edit", { clear = true })
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI" }, {
    group = group,
    desc = "Kode: ask for the next edit after a change",
    callback = function(args)
      M.on_change(args.buf)
    end,
  })
  vim.api.nvim_create_autocmd({ "BufLeave", "LspDetach" }, {
    group = group,
    desc = "Kode: dismiss the next edit",
    callback = function()
      M.dismiss()
    end,
  })
  vim.api.nvim_create_autocmd("User", {
    group = group,
    pattern = "KodeGhost",
    desc = "Kode: the completion's ghost text wins over the next edit",
    callback = function()
      if state.edit then
        M.render()
      end
    end,
  })
  vim.api.nvim_create_autocmd("ColorScheme", {
    group = group,
    desc = "Kode: next-edit highlight groups",
    callback = M.highlights,
  })
  -- <Esc> in Normal mode dismisses, and still does whatever it did (no mapping to steal).
  -- In Insert mode it only leaves it: the edit just typed is often what shows the next.
  vim.on_key(function(_, typed)
    local e = state.edit
    if typed == ESC and state.drawn and vim.api.nvim_get_mode().mode == "n" then
      vim.schedule(function()
        if state.edit == e then -- not one that came meanwhile
          M.clear()
        end
      end)
    end
  end, M.ns)
end

return M
