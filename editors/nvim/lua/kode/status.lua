--- A one-line status from the latest `kode/stats`, for statuslines and `:Kode status`.
local M = {}

---@param stats? table kode/stats result
---@param enabled boolean
---@return string
function M.line(stats, enabled)
  if not enabled then
    return "kode: off"
  end
  if type(stats) ~= "table" or type(stats.backend) ~= "string" then
    return "kode"
  end
  local model = type(stats.model) == "string" and stats.model:gsub("%.gguf$", "") or "?"
  local parts = { "kode:", stats.backend, model }
  local last = type(stats.counters) == "table" and stats.counters.last or nil
  if type(last) == "table" and (last.totalMs or 0) > 0 then
    parts[#parts + 1] = ("%dms"):format(last.totalMs)
    local decode = last.totalMs - last.ttftMs
    if last.completionTokens > 0 and decode > 0 then
      parts[#parts + 1] = ("%dtok/s"):format(last.completionTokens / decode * 1000)
    end
  end
  return table.concat(parts, " ")
end

return M
