--- Ghost text: one extmark, the first line inline at the cursor, the rest as virtual lines.
local M = {}

M.ns = vim.api.nvim_create_namespace("kode.ghost")

--- Virtual text shows a tab as one cell; draw it as the spaces it would take.
---@param s string
---@param buf integer
local function display(s, buf)
  return (s:gsub("\t", string.rep(" ", vim.bo[buf].tabstop)))
end

---@param buf integer
---@param row integer 0-based
---@param col integer 0-based byte column
---@param text string
---@param hl_group string
---@return integer extmark id
function M.show(buf, row, col, text, hl_group)
  M.clear(buf)
  local lines = vim.split(text, "\n", { plain = true })
  local opts = { hl_mode = "combine", priority = 200 }
  if lines[1] ~= "" then
    opts.virt_text = { { display(lines[1], buf), hl_group } }
    opts.virt_text_pos = "inline"
  end
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do
      opts.virt_lines[#opts.virt_lines + 1] = { { display(lines[i], buf), hl_group } }
    end
  end
  return vim.api.nvim_buf_set_extmark(buf, M.ns, row, col, opts)
end

---@param buf? integer nil: every buffer
function M.clear(buf)
  if buf == nil then
    for _, b in ipairs(vim.api.nvim_list_bufs()) do
      vim.api.nvim_buf_clear_namespace(b, M.ns, 0, -1)
    end
  elseif vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  end
end

--- The next piece of `text` to accept: "all", "line" (through the end of its first
--- non-empty line) or "word" (leading blanks and one word or run of punctuation).
---@param text string
---@param unit "all"|"line"|"word"
---@return string piece, string rest
function M.split(text, unit)
  local n
  if unit == "line" then
    local lead = text:match("^\n*") -- accepting a line break alone would look like nothing
    local eol = text:find("\n", #lead + 1, true)
    n = eol and eol - 1 or #text
  elseif unit == "word" then
    local piece = text:match("^%s*[%w_]+") or text:match("^%s*[^%w_%s]+") or text:match("^%s+")
    n = piece and #piece or #text
  else
    n = #text
  end
  return text:sub(1, n), text:sub(n + 1)
end

return M
