--- Inline completion for Neovim 0.11, which has no `vim.lsp.inline_completion`.
---
--- One suggestion at a time, for the cursor of the current window:
---   keystroke -> dismiss + cancel the in-flight request -> debounce -> request
---   reply or `kode/inlineCompletionPartial` -> checked against the document version,
---   changedtick and cursor it was asked for -> ghost text
---
--- Events for statuslines and tests: `User KodeRequest` (data: id, buf),
--- `User KodeResponse` (data: id, status = shown|empty|stale|error), `User KodePartial`
--- (data: id, text), `User KodeCancel` (data: id), `User KodeGhost` (data: buf, shown:
--- the ghost text was drawn or went away; kode.next_edit hides behind it).
local inflight = require("kode.inflight")
local config = require("kode.config")
local ghost = require("kode.ghost")

local M = {}

M.METHOD = "textDocument/inlineCompletion"
M.PARTIAL_METHOD = "kode/inlineCompletionPartial"
local AUTOMATIC = 2 -- lsp.InlineCompletionTriggerKind.Automatic

---@class kode.Request
---@field id? integer JSON-RPC id
---@field client_id integer
---@field buf integer
---@field version integer document version sent with the request (util.buf_versions)
---@field tick integer b:changedtick at request time
---@field row integer 0-based cursor row
---@field col integer 0-based cursor byte column

---@class kode.Suggestion
---@field buf integer
---@field row integer
---@field col integer
---@field tick integer
---@field text string
---@field partial boolean still growing (from a partial notification)

local state = {
  enabled = true,
  ---@type kode.Request?
  request = nil,
  ---@type kode.Suggestion?
  suggestion = nil,
  timer = nil, ---@type uv.uv_timer_t?
  ---@type { buf: integer, tick: integer, row: integer, col: integer }?
  hold = nil, -- ask nothing while the cursor stays here in unchanged text (M.hold)
}

local emit = inflight.emit

---@param buf integer
---@return vim.lsp.Client?
function M.client(buf)
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = buf, name = "kode" })) do
    if client.server_capabilities and client.server_capabilities.inlineCompletionProvider then
      return client
    end
  end
end

local function cursor()
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

--- Is the cursor still where `req` (or a suggestion) was made, in an unchanged buffer?
---@param it { buf: integer, tick: integer, row: integer, col: integer }
local function still_current(it)
  if vim.api.nvim_get_current_buf() ~= it.buf or vim.b[it.buf].changedtick ~= it.tick then
    return false
  end
  local row, col = cursor()
  return row == it.row and col == it.col
end

--- Cancel the in-flight request, if any ($/cancelRequest; its reply is then dropped).
function M.cancel()
  inflight.cancel(state, "KodeCancel")
end

--- Hide the suggestion (the request keeps running; see `dismiss`).
function M.clear()
  local s = state.suggestion
  if s then
    ghost.clear(s.buf)
    state.suggestion = nil
    emit("KodeGhost", { buf = s.buf, shown = false })
  end
end

--- Hide the suggestion and cancel its request. Returns whether anything was shown.
---@return boolean
function M.dismiss()
  local shown = state.suggestion ~= nil
  M.clear()
  M.cancel()
  return shown
end

---@return boolean
function M.visible()
  local s = state.suggestion
  return s ~= nil and still_current(s)
end

---@return kode.Suggestion?
function M.suggestion()
  return M.visible() and state.suggestion or nil
end

---@return kode.Request?
function M.pending()
  return state.request
end

---@param buf integer
---@param row integer
---@param col integer
---@param text string
---@param partial boolean
local function show(buf, row, col, text, partial)
  ghost.show(buf, row, col, text, config.options.hl_group)
  state.suggestion = {
    buf = buf,
    row = row,
    col = col,
    tick = vim.b[buf].changedtick,
    text = text,
    partial = partial,
  }
  emit("KodeGhost", { buf = buf, shown = true })
end

--- The text to draw at the cursor for one completion item, or nil if it does not fit.
--- An item whose range starts before the cursor repeats what was typed since; that part
--- is already in the buffer and is not drawn again.
---@param client vim.lsp.Client
---@param req kode.Request
---@param item lsp.InlineCompletionItem
---@return string?
local function item_text(client, req, item)
  local text = item.insertText
  if type(text) ~= "string" then
    return nil -- snippets: not produced by Kode
  end
  local range = item.range
  if not range then
    return text
  end
  if range.start.line ~= req.row or range["end"].line ~= req.row then
    return nil
  end
  local line = vim.api.nvim_buf_get_lines(req.buf, req.row, req.row + 1, true)[1]
  local enc = client.offset_encoding
  local start_col = vim.str_byteindex(line, enc, range.start.character, false)
  local end_col = vim.str_byteindex(line, enc, range["end"].character, false)
  if end_col ~= req.col or start_col > req.col then
    return nil
  end
  local typed = line:sub(start_col + 1, req.col)
  if text:sub(1, #typed) ~= typed then
    return nil
  end
  return text:sub(#typed + 1)
end

--- Reply to `req`. Exposed for tests (`_on_response`) to feed crafted replies.
---@param req kode.Request
---@param err? lsp.ResponseError
---@param result? lsp.InlineCompletionList|lsp.InlineCompletionItem[]
---@param ctx lsp.HandlerContext
function M._on_response(req, err, result, ctx)
  if state.request ~= req then
    return -- cancelled or superseded meanwhile
  end
  state.request = nil
  local function done(status)
    emit("KodeResponse", { id = req.id, status = status })
  end
  if err then
    if state.suggestion and state.suggestion.partial then
      M.clear()
    end
    return done("error")
  end
  if ctx.version ~= vim.lsp.util.buf_versions[req.buf] or not still_current(req) then
    return done("stale")
  end
  local client = vim.lsp.get_client_by_id(req.client_id)
  local items = result and (result.items or result) or {}
  for _, item in ipairs(client and items or {}) do
    local text = item_text(client, req, item)
    if text and text ~= "" then
      show(req.buf, req.row, req.col, text, false)
      M.refresh_stats(client)
      return done("shown")
    end
  end
  if state.suggestion and state.suggestion.partial then
    M.clear() -- the final answer is authoritative, even when it is empty
  end
  done("empty")
end

--- `kode/inlineCompletionPartial`: the suggestion so far, for the request `requestId`.
---@param params { requestId: integer|string, textDocument: { uri: string, version: integer }, text: string }
---@param ctx lsp.HandlerContext
function M.on_partial(_, params, ctx)
  local req = state.request
  if
    not req
    or type(params) ~= "table"
    or params.requestId ~= req.id
    or ctx.client_id ~= req.client_id
    or type(params.text) ~= "string"
    or params.text == ""
    or type(params.textDocument) ~= "table"
    or params.textDocument.version ~= req.version
    or vim.lsp.util.buf_versions[req.buf] ~= req.version
    or not still_current(req)
  then
    return
  end
  show(req.buf, req.row, req.col, params.text, true)
  emit("KodePartial", { id = req.id, text = params.text })
end

--- Ask for a suggestion at the cursor now (the debounce timer calls this).
---@return boolean sent
function M.request()
  local buf = vim.api.nvim_get_current_buf()
  local client = M.client(buf)
  if not state.enabled or not client then
    return false
  end
  M.cancel()
  local row, col = cursor()
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding) --[[@as table]]
  params.context = { triggerKind = AUTOMATIC }
  ---@type kode.Request
  local req = {
    client_id = client.id,
    buf = buf,
    version = 0,
    tick = vim.b[buf].changedtick,
    row = row,
    col = col,
  }
  state.request = req
  local ok, id = client:request(M.METHOD, params, function(err, result, ctx)
    M._on_response(req, err, result, ctx)
  end, buf)
  if not ok or not id then
    state.request = nil
    return false
  end
  req.id = id
  -- client:request flushed pending didChange first: this is the version the server has.
  req.version = vim.lsp.util.buf_versions[buf]
  emit("KodeRequest", { id = id, buf = buf })
  return true
end

--- Ask nothing at the cursor until it moves or the text changes: it was put there to
--- show something else (kode.next_edit jumped to a next edit).
function M.hold()
  M.dismiss()
  local row, col = cursor()
  local buf = vim.api.nvim_get_current_buf()
  state.hold = { buf = buf, tick = vim.b[buf].changedtick, row = row, col = col }
end

--- A keystroke or cursor move in Insert mode.
function M.on_change()
  if state.hold and still_current(state.hold) then
    return
  end
  state.hold = nil
  if state.suggestion and still_current(state.suggestion) then
    return -- the suggestion was just drawn or partly accepted: nothing moved under it
  end
  M.clear()
  M.cancel()
  if not state.enabled or not M.client(vim.api.nvim_get_current_buf()) then
    return
  end
  inflight.debounce(state, config.options.debounce_ms, function()
    if vim.api.nvim_get_mode().mode:sub(1, 1) == "i" then
      M.request()
    end
  end)
end

--- Insert the next `unit` of the suggestion; keep showing the rest.
---@param unit "all"|"line"|"word"
---@return boolean accepted
function M.accept(unit)
  local s = M.suggestion()
  if not s then
    return false
  end
  local piece, rest = ghost.split(s.text, unit or "all")
  -- Accepting edits the buffer, so a request still streaming into this suggestion is
  -- stale from now on: stop it and keep what it has shown.
  M.cancel()
  M.clear()
  local lines = vim.split(piece, "\n", { plain = true })
  vim.api.nvim_buf_set_text(s.buf, s.row, s.col, s.row, s.col, lines)
  local row = s.row + #lines - 1
  local col = (#lines == 1 and s.col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  if rest ~= "" then
    show(s.buf, row, col, rest, false)
  end
  return true
end

---@param enabled boolean
function M.set_enabled(enabled)
  state.enabled = enabled
  if not enabled then
    M.dismiss()
  end
  if config.options.builtin then
    for _, client in ipairs(vim.lsp.get_clients({ name = "kode" })) do
      vim.lsp.inline_completion.enable(enabled, { client_id = client.id })
    end
  end
end

---@return boolean
function M.is_enabled()
  return state.enabled
end

--- Latest `kode/stats` (refreshed after each shown suggestion), for statuslines.
M.stats = nil ---@type table?

---@param client vim.lsp.Client
function M.refresh_stats(client)
  client:request("kode/stats", vim.empty_dict(), function(err, result)
    if not err and type(result) == "table" then
      M.stats = result
    end
  end)
end

local cursor_timer = nil ---@type uv.uv_timer_t?

--- Tells the server where the cursor rests (`kode/didMoveCursor`, docs/protocol.md) once it
--- has stayed put for `ms`, so the server can prepare that place while the user reads.
---@param ms integer
function M.cursor_settles(ms)
  if cursor_timer then
    cursor_timer:stop()
  else
    cursor_timer = vim.uv.new_timer()
  end
  local buf = vim.api.nvim_get_current_buf()
  local win = vim.api.nvim_get_current_win()
  cursor_timer:start(ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_get_current_buf() ~= buf or vim.api.nvim_get_current_win() ~= win then
      return
    end
    local client = M.client(buf)
    if not client then
      return
    end
    local params = vim.lsp.util.make_position_params(win, client.offset_encoding) --[[@as table]]
    client:notify("kode/didMoveCursor", {
      textDocument = { uri = params.textDocument.uri },
      position = params.position,
    })
  end))
end

function M.attach_autocmds()
  local group = vim.api.nvim_create_augroup("kode.completion", { clear = true })
  vim.api.nvim_create_autocmd({ "CursorMoved", "CursorMovedI", "BufEnter" }, {
    group = group,
    desc = "Kode: tell the server where the cursor rests",
    callback = function()
      M.cursor_settles(150)
    end,
  })
  vim.api.nvim_create_autocmd({ "InsertEnter", "TextChangedI", "CursorMovedI" }, {
    group = group,
    desc = "Kode: ask for a suggestion after typing",
    callback = function()
      M.on_change()
    end,
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave", "TextChanged" }, {
    group = group,
    desc = "Kode: dismiss the suggestion",
    -- Not `callback = M.dismiss`: a callback returning true deletes its autocommand.
    callback = function()
      M.dismiss()
    end,
  })
end

return M
