--- Kode: inline code completion from the Kode language server (`kode lsp`).
---
---   require("kode").setup({ cmd = { "/path/to/.venv/bin/kode", "lsp" } })
---
--- Without `cmd`: the server :KodeInstall installed, else `kode` on PATH.
---
--- Neovim >= 0.12 shows suggestions with `vim.lsp.inline_completion`; on 0.11 Kode draws
--- them itself (kode.completion), including text streamed while it is generated.
local M = {}

---@param opts? kode.Config|table
function M.setup(opts)
  local o = require("kode.config").setup(opts)
  vim.api.nvim_set_hl(0, "KodeGhostText", { link = "Comment", default = true })
  require("kode.lsp").setup(o)
  require("kode.keys").setup(o)
  -- Next edits (kode.next_edit): highlight groups, autocommands, :KodeNextEdit.
  require("kode.next_edit").setup()
  vim.api.nvim_create_user_command("KodeNextEdit", function()
    require("kode.next_edit").ask()
  end, { desc = "Kode: ask for the next edit now (kode/inlineEdit)" })
  local actions = { "enable", "disable", "toggle", "status" }
  vim.api.nvim_create_user_command("Kode", function(cmd)
    local action = cmd.fargs[1] or "status"
    if not vim.tbl_contains(actions, action) then
      return vim.notify("Kode: unknown action " .. action, vim.log.levels.ERROR)
    end
    M[action]()
  end, {
    nargs = "?",
    complete = function()
      return actions
    end,
    desc = "Kode: enable | disable | toggle | status",
  })
  vim.api.nvim_create_user_command("KodeDoctor", function()
    M.doctor()
  end, { desc = "Kode: check the setup and time a tiny completion (kode doctor)" })
  vim.api.nvim_create_user_command("KodeInstall", function(cmd)
    if cmd.fargs[1] == "cancel" then
      return require("kode.install").cancel()
    end
    require("kode.install").run()
  end, {
    nargs = "?",
    complete = function()
      return { "cancel" }
    end,
    desc = "Kode: install (or update, or go on with) the server under stdpath('data'); cancel stops it",
  })
end

local function completion()
  return require("kode.completion")
end

function M.accept() return completion().accept("all") end
function M.accept_line() return completion().accept("line") end
function M.accept_word() return completion().accept("word") end
function M.dismiss() return completion().dismiss() end
function M.enable() completion().set_enabled(true) end
function M.disable()
  completion().set_enabled(false)
  require("kode.next_edit").dismiss() -- and asks for none while off
end
function M.toggle()
  if completion().is_enabled() then M.disable() else M.enable() end
end

--- Change server settings at run time (merged into the configured ones).
---@param settings table<string, any>
function M.update_settings(settings)
  local o = require("kode.config").options
  o.settings = vim.tbl_deep_extend("force", o.settings, settings)
  require("kode.lsp").notify_settings(o.settings)
end

--- "kode: llama.cpp qwen2.5-coder-0.5b-instruct 830ms 41tok/s", for statuslines.
function M.statusline()
  local line = require("kode.status").line(completion().stats, completion().is_enabled())
  local hint = require("kode.next_edit").hint()
  return hint and (line .. " · " .. hint) or line
end

--- `kode doctor` with the timed completion, in the background; the result via vim.notify.
function M.doctor()
  require("kode.doctor").run()
end

function M.status()
  vim.notify(M.statusline(), vim.log.levels.INFO)
end

return M
