--- The request a module keeps in flight, debounced and cancellable: what the completion
--- (`kode.completion`) and the next edit (`kode.next_edit`) each hold in their state, as
--- `state.timer` (the debounce) and `state.request` (`{ id, client_id, ... }`).
local M = {}

--- Fire the User autocmd `pattern` with `data`.
function M.emit(pattern, data)
  vim.api.nvim_exec_autocmds("User", { pattern = pattern, modeline = false, data = data })
end

--- Cancel the debounce and the request in flight, if any ($/cancelRequest; its answer is
--- then dropped), firing `event` with the request's id.
---@param state { timer: uv.uv_timer_t?, request: { id: integer?, client_id: integer }? }
---@param event string
function M.cancel(state, event)
  if state.timer then
    state.timer:stop()
  end
  local req = state.request
  state.request = nil
  if req and req.id then
    local client = vim.lsp.get_client_by_id(req.client_id)
    if client then
      client:cancel_request(req.id)
    end
    M.emit(event, { id = req.id })
  end
end

--- Run `fn` on the main loop after `ms` without another call (each call restarts it).
---@param state { timer: uv.uv_timer_t? }
function M.debounce(state, ms, fn)
  state.timer = state.timer or assert(vim.uv.new_timer())
  state.timer:start(ms, 0, vim.schedule_wrap(fn))
end

return M
