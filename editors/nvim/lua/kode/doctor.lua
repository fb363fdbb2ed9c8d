--- `kode doctor --json`: the setup checks (and a timed tiny completion), run with the
--- configured server command, for `:checkhealth kode` and `:KodeDoctor`.
---
--- The report is a JSON list of `{name, status: OK|WARN|FAIL, detail, fix}` on stdout; the
--- progress ("kode doctor: <step>") goes to stderr; exit status 1 when a check failed.
local M = {}

M.HEALTH_TIMEOUT_MS = 30000 -- without the model: seconds, even on a busy machine
M.FULL_TIMEOUT_MS = 180000 -- loading a model and timing it on a loaded 2-core machine

local STATUSES = { OK = true, WARN = true, FAIL = true }

---@class kode.Check
---@field name string
---@field status "OK"|"WARN"|"FAIL"
---@field detail string
---@field fix? string

--- The doctor's argv from the server command: what comes before its `lsp` argument
--- (`{ "/venv/bin/kode", "lsp" }` -> `{ "/venv/bin/kode", "doctor", "--json" }`).
---@param cmd string[]
---@param full? boolean Also time a completion (else `--skip-model`).
---@return string[]
function M.command(cmd, full)
  local base = {}
  for i = #cmd, 1, -1 do
    if cmd[i] == "lsp" then
      base = vim.list_slice(cmd, 1, i - 1)
      break
    end
  end
  if #base == 0 then
    base = { cmd[1] }
  end
  local argv = vim.list_extend(vim.deepcopy(base), { "doctor", "--json" })
  if not full then
    argv[#argv + 1] = "--skip-model"
  end
  return argv
end

--- The checks in `stdout`, or nil and why it is no report.
---@param stdout string
---@return kode.Check[]|nil, string?
function M.parse(stdout)
  if vim.trim(stdout or "") == "" then
    return nil, "it printed no report"
  end
  local ok, value = pcall(vim.json.decode, stdout, { luanil = { object = true, array = true } })
  if not ok then
    return nil, "its output is not JSON"
  end
  if type(value) ~= "table" or not vim.islist(value) or #value == 0 then
    return nil, "its output is not a list of checks"
  end
  local checks = {}
  for i, item in ipairs(value) do
    local fine = type(item) == "table"
      and type(item.name) == "string"
      and STATUSES[item.status]
      and type(item.detail) == "string"
      and (item.fix == nil or type(item.fix) == "string")
    if not fine then
      return nil, ("check %d of its output is not {name, status: OK|WARN|FAIL, detail, fix}"):format(i)
    end
    checks[i] = { name = item.name, status = item.status, detail = item.detail, fix = item.fix }
  end
  return checks
end

---@param text string
---@param count integer
---@return string[]
local function last_lines(text, count)
  local lines = vim.tbl_filter(function(line)
    return vim.trim(line) ~= ""
  end, vim.split(text or "", "\n", { plain = true }))
  return vim.list_slice(lines, math.max(1, #lines - count + 1))
end

local function plural(n, word)
  return ("%d %s%s"):format(n, word, n == 1 and "" or "s")
end

---@class kode.DoctorReport
---@field checks kode.Check[] Empty when the run gave no report.
---@field error? string Why there is no report (with the end of stderr in `lines`).
---@field lines string[] One per check, its fix below it, then the summary.
---@field summary string
---@field level integer vim.log.levels: INFO all OK, WARN, ERROR a failed check or no report.

--- What to show for a finished run (`vim.system`'s result: code, signal, stdout, stderr).
---@param result { code: integer?, signal: integer?, stdout: string?, stderr: string? }
---@param shown? string The command, for messages.
---@return kode.DoctorReport
function M.report(result, shown)
  shown = shown or "kode doctor --json"
  local checks, why = M.parse(result.stdout or "")
  if not checks then
    local ended
    if result.code == 124 then
      ended = "timed out"
    elseif result.signal and result.signal ~= 0 then
      ended = ("killed by signal %d"):format(result.signal)
    else
      ended = ("exit status %s"):format(tostring(result.code))
    end
    local err = ("%s (%s)"):format(why, ended)
    if (result.stderr or ""):find("invalid choice: 'doctor'", 1, true) then
      err = err .. "; this kode is older than `kode doctor`"
    end
    local lines = { ("%s: %s"):format(shown, err) }
    for _, line in ipairs(last_lines(result.stderr, 8)) do
      lines[#lines + 1] = "  " .. line
    end
    return {
      checks = {},
      error = err,
      lines = lines,
      summary = ("Kode: kode doctor failed: %s"):format(err),
      level = vim.log.levels.ERROR,
    }
  end
  local lines, fails, warns = {}, {}, {}
  for _, check in ipairs(checks) do
    lines[#lines + 1] = ("%-4s  %s: %s"):format(check.status, check.name, check.detail)
    if check.fix then
      lines[#lines + 1] = "      fix: " .. check.fix
    end
    if check.status == "FAIL" then
      fails[#fails + 1] = check.name
    elseif check.status == "WARN" then
      warns[#warns + 1] = check.name
    end
  end
  local summary, level
  if #fails > 0 then
    summary = ("Kode setup: %s (%s)"):format(plural(#fails, "problem"), table.concat(fails, ", "))
    if #warns > 0 then
      summary = summary .. ("; %s (%s)"):format(plural(#warns, "warning"), table.concat(warns, ", "))
    end
    level = vim.log.levels.ERROR
  elseif #warns > 0 then
    summary = ("Kode setup: %s (%s)"):format(plural(#warns, "warning"), table.concat(warns, ", "))
    level = vim.log.levels.WARN
  else
    summary = ("Kode setup: all %s OK"):format(plural(#checks, "check"))
    level = vim.log.levels.INFO
  end
  lines[#lines + 1] = summary
  return { checks = checks, lines = lines, summary = summary, level = level }
end

--- "ENOENT: no such file or directory (cmd): 'x'" from vim.system's error.
---@param err any
---@return string
function M.spawn_error(err)
  local text = tostring(err)
  return text:match("(E%u+: .*)$") or text
end

--- Starts `argv`; calls `on_done(report)` in the main loop. Returns the vim.SystemObj,
--- or nil when it could not be started (then `on_done` was called with the reason).
---@param argv string[]
---@param timeout_ms integer
---@param on_done fun(report: kode.DoctorReport)
---@return vim.SystemObj?
function M.start(argv, timeout_ms, on_done)
  local shown = table.concat(argv, " ")
  local ok, obj = pcall(vim.system, argv, { text = true, timeout = timeout_ms }, function(result)
    vim.schedule(function()
      on_done(M.report(result, shown))
    end)
  end)
  if not ok then
    local err = ("could not start %s: %s"):format(argv[1], M.spawn_error(obj))
    on_done({ checks = {}, error = err, lines = { err }, summary = "Kode: " .. err, level = vim.log.levels.ERROR })
    return nil
  end
  return obj
end

--- Runs the doctor and waits (for :checkhealth).
---@param argv string[]
---@param timeout_ms integer
---@return kode.DoctorReport
function M.run_sync(argv, timeout_ms)
  local ok, obj = pcall(vim.system, argv, { text = true, timeout = timeout_ms })
  if not ok then
    local err = ("could not start %s: %s"):format(argv[1], M.spawn_error(obj))
    return { checks = {}, error = err, lines = { err }, summary = "Kode: " .. err, level = vim.log.levels.ERROR }
  end
  -- nil when killed at the timeout while a child of its own still holds the pipes
  local result = obj:wait() or { code = 124, signal = 9, stdout = "", stderr = "" }
  return M.report(result, table.concat(argv, " "))
end

local running ---@type vim.SystemObj?

--- `:KodeDoctor`: the full check (a timed completion included), in the background; the
--- result in one vim.notify.
---@param cmd? string[] The server command; default: the configured one.
function M.run(cmd)
  if running then
    return vim.notify("Kode: kode doctor is already running", vim.log.levels.WARN)
  end
  local argv = M.command(cmd or require("kode.config").options.cmd or require("kode.install").command(), true)
  if vim.fn.executable(argv[1]) ~= 1 then
    return vim.notify(
      ("Kode: the server executable was not found: %s (see :checkhealth kode)"):format(argv[1]),
      vim.log.levels.ERROR
    )
  end
  vim.notify("Kode: checking the setup and timing a tiny completion (kode doctor, 10-30 s)…", vim.log.levels.INFO)
  running = M.start(argv, M.FULL_TIMEOUT_MS, function(report)
    running = nil
    vim.notify(table.concat(report.lines, "\n"), report.level, { title = "kode doctor" })
  end)
end

return M
