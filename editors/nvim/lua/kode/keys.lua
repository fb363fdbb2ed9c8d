--- Keys that act on the suggestion (Insert mode) or the next edit (Normal and Insert mode)
--- while one shows, and otherwise do what they did before Kode: the previous global
--- mapping (kept under a <Plug> name) or the plain key.
local M = {}

---@param mode string
---@param lhs string
---@param name string
---@return string plug the key sequence that performs the fallback
local function fallback(mode, lhs, name)
  local plug = ("<Plug>(kode-fallback-%s)"):format(name)
  local prev = vim.fn.maparg(lhs, mode, false, true)
  local mapped = type(prev) == "table" and next(prev) ~= nil and prev.buffer == 0
  if mapped and (prev.desc or ""):match("^Kode:") then
    -- setup() ran before: the fallback it made is still in place.
    if vim.fn.maparg(plug, mode) ~= "" then
      return plug
    end
  elseif mapped then
    prev.lhs = plug
    prev.lhsraw = vim.api.nvim_replace_termcodes(plug, true, true, true)
    prev.lhsrawalt = nil
    vim.fn.mapset(mode, false, prev)
    return plug
  end
  vim.keymap.set(mode, plug, lhs, { noremap = true, desc = "Kode: fallback for " .. lhs })
  return plug
end

---@class kode.KeyChoice
---@field when fun(): any
---@field keys string what the mapping types when `when()` holds

--- What runs Lua through <Cmd> (an expr mapping cannot edit text itself).
---@param lua string
---@return string
function M.run(lua)
  return ("<Cmd>lua %s<CR>"):format(lua)
end

--- Map `lhs` in `mode`: the keys of the first choice whose `when()` holds, else the fallback.
---@param mode "i"|"n"
---@param lhs string|false
---@param name string
---@param choices kode.KeyChoice[]
---@param desc string
function M.map(mode, lhs, name, choices, desc)
  if not lhs or lhs == "" then
    return
  end
  local plug = fallback(mode, lhs, name)
  vim.keymap.set(mode, lhs, function()
    for _, choice in ipairs(choices) do
      if choice.when() then
        return choice.keys
      end
    end
    return plug
  end, { expr = true, remap = true, replace_keycodes = true, desc = "Kode: " .. desc })
end

---@param o kode.Config
function M.setup(o)
  local completion = require("kode.completion")
  local next_edit = require("kode.next_edit")
  ---@type kode.KeyChoice
  local take_edit = { when = next_edit.tab_ready, keys = M.run("require('kode.next_edit').tab()") }
  local accept ---@type kode.KeyChoice
  if o.builtin then
    -- get() schedules the edit itself (so it may run in an expr mapping) and returns
    -- whether there was a suggestion to accept. The built-in UI has no partial accept.
    accept = {
      when = function()
        return completion.is_enabled() and vim.lsp.inline_completion.get()
      end,
      keys = "",
    }
  else
    accept = { when = completion.visible, keys = M.run("require('kode').accept()") }
  end
  -- The suggestion at the cursor first, then the next edit.
  local same = o.keys.next_edit == o.keys.accept
  M.map("i", o.keys.accept, "accept", same and { accept, take_edit } or { accept }, "accept the suggestion")
  -- Mapped whether next edits are on or not (update_settings may turn them on later).
  if not same then
    M.map("i", o.keys.next_edit, "next_edit", { take_edit }, "jump to the next edit, then apply it")
  end
  M.map("n", o.keys.next_edit, "next_edit", { take_edit }, "jump to the next edit, then apply it")
  if o.builtin then
    return
  end
  local function shows(lua)
    return { { when = completion.visible, keys = M.run(lua) } }
  end
  M.map("i", o.keys.accept_line, "accept_line", shows("require('kode').accept_line()"), "accept a line")
  M.map("i", o.keys.accept_word, "accept_word", shows("require('kode').accept_word()"), "accept a word")
  M.map("i", o.keys.dismiss, "dismiss", shows("require('kode').dismiss()"), "dismiss the suggestion")
end

return M
