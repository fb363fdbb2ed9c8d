--- :checkhealth kode
local M = {}

local health = vim.health

---@param client vim.lsp.Client
local function report_stats(client)
  local response, err = client:request_sync("kode/stats", vim.empty_dict(), 5000)
  if not response then
    return health.error(("kode/stats failed: %s"):format(err or "no answer"))
  end
  if response.err then
    return health.error(("kode/stats failed: %s"):format(response.err.message or vim.inspect(response.err)))
  end
  local stats = response.result or {}
  local settings = type(stats.settings) == "table" and stats.settings or {}
  health.info(("backend setting: %s, model setting: %s"):format(
    tostring(settings.backend),
    tostring(settings.model)
  ))
  if type(stats.backend) == "string" then
    health.ok(("backend: %s"):format(stats.backend))
    health.ok(("model: %s"):format(tostring(stats.model)))
  else
    health.warn("no model loaded yet (it loads on the first completion, or failed to: see :LspLog)")
  end
  local counters = type(stats.counters) == "table" and stats.counters or nil
  if counters then
    health.info(("%d completions, %d cancelled; %s"):format(
      counters.generations or 0,
      counters.cancelled or 0,
      require("kode.status").line(stats, true)
    ))
  end
end

--- `kode doctor --json --skip-model`: each check as ok/warn/error, its fix as advice.
---@param cmd string[]
local function report_doctor(cmd)
  local doctor = require("kode.doctor")
  local argv = doctor.command(cmd, false)
  health.start("kode doctor")
  health.info(("%s (the timed completion: :KodeDoctor)"):format(table.concat(argv, " ")))
  local report = doctor.run_sync(argv, doctor.HEALTH_TIMEOUT_MS)
  M.show(report)
end

--- A doctor report through vim.health (also used by the tests).
---@param report kode.DoctorReport
function M.show(report)
  if report.error then
    local advice = vim.list_slice(report.lines, 2)
    return health.error("kode doctor failed: " .. report.error, #advice > 0 and advice or nil)
  end
  for _, check in ipairs(report.checks) do
    local msg = ("%s: %s"):format(check.name, check.detail)
    local advice = check.fix and { check.fix } or nil
    if check.status == "OK" then
      health.ok(msg)
    elseif check.status == "WARN" then
      health.warn(msg, advice)
    else
      health.error(msg, advice)
    end
  end
end

function M.check()
  health.start("kode")
  if vim.fn.has("nvim-0.11") == 0 then
    return health.error("Neovim 0.11 or newer is required")
  end
  local config = require("kode.config").options
  local mode = config.builtin and "vim.lsp.inline_completion (built-in)" or "Kode's ghost text"
  health.ok(("Neovim %s; suggestions drawn by %s"):format(tostring(vim.version()), mode))
  if config.settings.nextEdits == true then
    health.ok(("next edits: on (%s jumps to one, then applies it; :KodeNextEdit asks now)"):format(
      config.keys.next_edit or "no key"
    ))
  else
    health.info('next edits: off (turn them on with require("kode").setup({ next_edits = true }))')
  end

  local install = require("kode.install")
  local cmd = config.cmd or install.command()
  local exe = cmd[1]
  local found = vim.fn.executable(exe) == 1
  local origin = require("kode.config").cmd_configured and "cmd in setup()"
    or exe == install.installed() and ("installed by :KodeInstall in %s"):format(install.target())
    or "on PATH"
  if found then
    health.ok(("server: %s (%s)"):format(vim.fn.exepath(exe), origin))
  else
    health.error(("server executable not found: %s"):format(exe), {
      ":KodeInstall installs it (a Python 3.11+ and a C/C++ compiler; 3.5 GB; minutes: it builds llama.cpp)",
      'or install Kode yourself: require("kode").setup({ cmd = { "/path/to/.venv/bin/kode", "lsp" } })',
    })
  end
  if not install.installed() and vim.uv.fs_stat(install.target() .. "/envs") then
    health.warn(("an install in %s is not complete"):format(install.target()), {
      (":KodeInstall goes on where it stopped (its log: %s/install.log)"):format(install.target()),
    })
  end

  if not vim.lsp.is_enabled("kode") then
    health.warn('the "kode" LSP config is not enabled: call require("kode").setup()')
  elseif #vim.lsp.get_clients({ name = "kode" }) == 0 then
    health.info("no kode server running: open a file to start one, then run :checkhealth kode again")
  else
    for _, client in ipairs(vim.lsp.get_clients({ name = "kode" })) do
      local info = client.server_info or {}
      health.ok(("server running (client %d): %s %s"):format(client.id, info.name or "?", info.version or "?"))
      if not (client.server_capabilities and client.server_capabilities.inlineCompletionProvider) then
        health.error("the server does not offer textDocument/inlineCompletion")
      end
      report_stats(client)
    end
  end
  if found then
    report_doctor(cmd)
  end
end

return M
