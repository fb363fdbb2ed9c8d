-- An in-process language server named "kode" for the next-edit tests (run.lua): the
-- client's logic against answers the test holds back and gives when it says, with no
-- model and no timing. Loaded by child_init.lua as `_G.F`.
--
-- Requests are recorded (`F.requests`); `kode/inlineEdit` is held until `F.answer`, the
-- others are answered at once (`textDocument/inlineCompletion` with `F.ghost`, if set).
-- `$/cancelRequest` answers the held request with -32800, as the real server does; with
-- `F.late`, it leaves it held, as if the answer had crossed the cancel on the wire.

local F = { requests = {}, held = {}, cancelled = {}, ghost = nil, late = false, clients = {}, buffers = {} }

local CAPABILITIES = {
  textDocumentSync = { openClose = true, change = 2 },
  inlineCompletionProvider = true,
}

local function reply(r, err, result)
  vim.schedule(function()
    if r.done then
      r.done(r.id)
    end
    r.callback(err, result)
  end)
end

local function answer_now(method, params)
  if method == "initialize" then
    return { capabilities = CAPABILITIES }
  elseif method == "textDocument/inlineCompletion" then
    if not F.ghost then
      return { items = {} }
    end
    local pos = params.position
    return { items = { { insertText = F.ghost, range = { start = pos, ["end"] = pos } } } }
  end
  return vim.NIL -- kode/stats, shutdown
end

local function cmd(dispatchers)
  local closing = false
  local next_id = 0
  return {
    request = function(method, params, callback, notify_reply_callback)
      next_id = next_id + 1
      local r = { id = next_id, method = method, params = params, callback = callback, done = notify_reply_callback }
      F.requests[#F.requests + 1] = { id = r.id, method = method, params = params }
      if method == "kode/inlineEdit" then
        F.held[#F.held + 1] = r
      else
        reply(r, nil, answer_now(method, params))
      end
      return true, r.id
    end,
    notify = function(method, params)
      if method == "$/cancelRequest" then
        F.cancelled[#F.cancelled + 1] = params.id
        for i, r in ipairs(F.late and {} or F.held) do
          if r.id == params.id then
            table.remove(F.held, i)
            reply(r, { code = -32800, message = "Request cancelled" })
            break
          end
        end
      elseif method == "exit" then
        closing = true
      end
      return true
    end,
    is_closing = function()
      return closing
    end,
    terminate = function()
      if not closing then
        closing = true
        vim.schedule(function()
          dispatchers.on_exit(0, 0)
        end)
      end
    end,
  }
end

--- A scratch buffer named `path` (no file: the real server's config does not attach to
--- it) with `lines`, current, with a fresh fake client attached. Returns the buffer.
function F.open(path, lines)
  vim.cmd("stopinsert")
  F.requests, F.held, F.cancelled, F.ghost, F.late = {}, {}, {}, nil, false
  local buf = vim.api.nvim_create_buf(true, false)
  vim.bo[buf].buftype = "nofile"
  vim.api.nvim_buf_set_name(buf, path)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.api.nvim_set_current_buf(buf)
  F.clients[#F.clients + 1] = vim.lsp.start({ name = "kode", cmd = cmd }, {
    bufnr = buf,
    reuse_client = function()
      return false
    end,
  })
  F.buffers[#F.buffers + 1] = buf
  return buf
end

--- Stop the fake clients and wipe their buffers: the other tests see only the real
--- server's "kode" clients. Returns once none of the fakes is left.
function F.close()
  for _, id in ipairs(F.clients) do
    local client = vim.lsp.get_client_by_id(id)
    if client then
      client:stop(true)
    end
  end
  for _, buf in ipairs(F.buffers) do
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_delete(buf, { force = true })
    end
  end
  F.buffers = {}
  vim.wait(5000, function()
    for _, id in ipairs(F.clients) do
      if vim.lsp.get_client_by_id(id) then
        return false
      end
    end
    return true
  end)
  F.clients = {}
end

function F.ready()
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = 0, name = "kode" })) do
    if client.initialized then
      return true
    end
  end
  return false
end

--- The `kode/inlineEdit` requests so far: { id, params }.
function F.edit_requests()
  local found = {}
  for _, r in ipairs(F.requests) do
    if r.method == "kode/inlineEdit" then
      found[#found + 1] = { id = r.id, params = r.params }
    end
  end
  return found
end

--- Answer the held `kode/inlineEdit` request `id` (default: the latest) with `edits`.
--- Returns whether one was held.
function F.answer(edits, id)
  for i = #F.held, 1, -1 do
    local r = F.held[i]
    if id == nil or r.id == id then
      table.remove(F.held, i)
      reply(r, nil, { edits = edits })
      return true
    end
  end
  return false
end

--- One edit of the current buffer: rows and columns 0-based (UTF-16 = bytes in ASCII).
function F.edit(version, srow, scol, erow, ecol, text)
  return {
    textDocument = { uri = vim.uri_from_bufnr(0), version = version },
    range = { start = { line = srow, character = scol }, ["end"] = { line = erow, character = ecol } },
    text = text,
  }
end

--- The next edit as drawn: the struck-through span and the inserted virtual text.
function F.drawn()
  local ns = require("kode.next_edit").ns
  local found = { struck = false, insert = false }
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
    local d = m[4]
    if d.hl_group == "KodeNextEditDelete" then
      found.struck = { row = m[2], col = m[3], end_row = d.end_row, end_col = d.end_col }
    else
      local lines = { d.virt_text and d.virt_text[1][1] or "" }
      for _, chunks in ipairs(d.virt_lines or {}) do
        lines[#lines + 1] = chunks[1][1]
      end
      found.insert = { row = m[2], col = m[3], text = table.concat(lines, "\n"), hl = (d.virt_text or d.virt_lines[1])[1][2] }
    end
  end
  return found
end

return F
