--- Insert-mode keys that act on the suggestion while one shows, and otherwise do what
--- they did before Kode: the previous global mapping (kept under a <Plug> name) or the
--- plain key.
local M = {}

---@param lhs string
---@param name string
---@return string plug the key sequence that performs the fallback
local function fallback(lhs, name)
  local plug = ("<Plug>(kode-fallback-%s)"):format(name)
  local prev = vim.fn.maparg(lhs, "i", false, true)
  local mapped = type(prev) == "table" and next(prev) ~= nil and prev.buffer == 0
  if mapped and (prev.desc or ""):match("^Kode:") then
    -- setup() ran before: the fallback it made is still in place.
    if vim.fn.maparg(plug, "i") ~= "" then
      return plug
    end
  elseif mapped then
    prev.lhs = plug
    prev.lhsraw = vim.api.nvim_replace_termcodes(plug, true, true, true)
    prev.lhsrawalt = nil
    vim.fn.mapset("i", false, prev)
    return plug
  end
  vim.keymap.set("i", plug, lhs, { noremap = true, desc = "Kode: fallback for " .. lhs })
  return plug
end

--- Map `lhs` (Insert mode) to `action` while a suggestion shows.
---@param lhs string|false
---@param name string
---@param visible fun(): boolean
---@param action string Lua expression run through <Cmd> (mappings cannot edit text in expr mode)
---@param desc string
function M.map(lhs, name, visible, action, desc)
  if not lhs or lhs == "" then
    return
  end
  local plug = fallback(lhs, name)
  local run = ("<Cmd>lua %s<CR>"):format(action)
  vim.keymap.set("i", lhs, function()
    return visible() and run or plug
  end, { expr = true, remap = true, replace_keycodes = true, desc = "Kode: " .. desc })
end

---@param o kode.Config
function M.setup(o)
  local completion = require("kode.completion")
  if o.builtin then
    -- get() schedules the edit itself (so it may run in an expr mapping) and returns
    -- whether there was a suggestion to accept. The built-in UI has no partial accept.
    if o.keys.accept then
      local plug = fallback(o.keys.accept, "accept")
      vim.keymap.set("i", o.keys.accept, function()
        return completion.is_enabled() and vim.lsp.inline_completion.get() and "" or plug
      end, { expr = true, remap = true, replace_keycodes = true, desc = "Kode: accept the suggestion" })
    end
    return
  end
  local visible = completion.visible
  M.map(o.keys.accept, "accept", visible, "require('kode').accept()", "accept the suggestion")
  M.map(o.keys.accept_line, "accept_line", visible, "require('kode').accept_line()", "accept a line")
  M.map(o.keys.accept_word, "accept_word", visible, "require('kode').accept_word()", "accept a word")
  M.map(o.keys.dismiss, "dismiss", visible, "require('kode').dismiss()", "dismiss the suggestion")
end

return M
