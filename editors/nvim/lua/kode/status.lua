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
  -- The last answer (not `counters.last`, the backend's last generation: often a
  -- one-token background preparation, which read `176ms 10000tok/s` after a 13 s answer).
  local last = stats.lastCompletion
  if type(last) == "table" and type(last.answerMs) == "number" then
    parts[#parts + 1] = ("%dms"):format(math.floor(last.answerMs + 0.5))
    if type(last.tokensPerS) == "number" and last.tokensPerS > 0 then
      parts[#parts + 1] = ("%dtok/s"):format(math.floor(last.tokensPerS + 0.5))
    end
  end
  return table.concat(parts, " ")
end

return M
