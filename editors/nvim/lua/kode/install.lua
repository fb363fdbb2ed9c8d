--- :KodeInstall: the Kode server in a private environment under stdpath("data"), made by
--- the installer both editors share (editors/install/kode_install.py, in the repository
--- this plugin lives in, which is also what it installs). Progress by vim.notify, one line
--- per step; everything pip and CMake print goes to the log it names.
---
--- The installer makes `<target>/current/bin/kode` and marks it complete with
--- `<target>/current/kode-install.json`; its docstring describes the layout and the lines
--- it prints (one JSON object each).
local M = {}

--- Looked up on PATH: the newest first.
M.PYTHONS = { "python3.13", "python3.12", "python3.11", "python3" }

local this_file = debug.getinfo(1, "S").source:sub(2)

--- The repository this plugin lives in (editors/nvim/lua/kode/install.lua: five up).
---@return string
function M.repository()
  return vim.fn.fnamemodify(this_file, ":p:h:h:h:h:h")
end

---@return string
function M.target()
  return vim.fn.stdpath("data") .. "/kode/server"
end

---@return string
function M.script()
  return M.repository() .. "/editors/install/kode_install.py"
end

--- The installed server, or nil: only a complete environment's (the installer's
--- `installed_kode`, the same rule).
---@param target? string
---@return string?
function M.installed(target)
  local env = (target or M.target()) .. "/current"
  local kode = env .. "/bin/kode"
  if vim.uv.fs_stat(env .. "/kode-install.json") and vim.fn.executable(kode) == 1 then
    return kode
  end
end

--- The server command when `cmd` is not configured: the server :KodeInstall installed (the
--- user chose it), else `kode` on PATH.
---@return string[]
function M.command()
  return { M.installed() or "kode", "lsp" }
end

--- `{ executable, version }` of each of `names` on PATH that runs, until one is 3.11+.
--- Returns that one; else the first that runs (the installer then says it is too old and
--- what to install); else nil.
---@param names? string[]
---@return { executable: string, version: integer[] }?
function M.find_python(names)
  local fallback
  for _, name in ipairs(names or M.PYTHONS) do
    local exe = vim.fn.exepath(name)
    if exe ~= "" then
      local ok, obj = pcall(vim.system, { exe, "-c", "import sys; print('%d %d %d' % sys.version_info[:3])" }, { text = true })
      local result = ok and obj:wait(20000) or nil
      if result and result.code == 0 then
        local version = vim.tbl_map(tonumber, vim.split(vim.trim(result.stdout or ""), " "))
        local found = { executable = exe, version = version }
        if #version == 3 and (version[1] > 3 or (version[1] == 3 and version[2] >= 11)) then
          return found
        end
        fallback = fallback or found
      end
    end
  end
  return fallback
end

---@class kode.InstallEvent
---@field event "start"|"step"|"skip"|"progress"|"done"|"error"|"cancelled"
---@field step? string
---@field index? integer
---@field total? integer
---@field title? string
---@field message? string
---@field fix? string
---@field log? string
---@field kode? string
---@field version? string
---@field seconds? number

--- One of the installer's lines, or nil.
---@param line string
---@return kode.InstallEvent?
function M.parse(line)
  local ok, value = pcall(vim.json.decode, line, { luanil = { object = true, array = true } })
  if ok and type(value) == "table" and type(value.event) == "string" then
    return value
  end
end

local function took(seconds)
  local s = math.floor((seconds or 0) + 0.5)
  return s < 60 and ("%d s"):format(s) or ("%d min %d s"):format(math.floor(s / 60), s % 60)
end

--- The vim.notify text and level for an event; nil for the lines only the log shows.
--- Progress lines stay short: a message wider than the screen makes Neovim wait for
--- Enter (the hit-enter prompt), and the next steps' lines with it.
---@param event kode.InstallEvent
---@return string?, integer?
function M.message(event)
  local levels = vim.log.levels
  if event.event == "step" or event.event == "skip" then
    local done = event.event == "skip" and " (done already)" or ""
    return ("Kode install %d/%d: %s%s"):format(event.index, event.total, event.title, done), levels.INFO
  elseif event.event == "done" then
    return ("Kode: the server is installed (Kode %s, in %s)"):format(event.version, took(event.seconds)), levels.INFO
  elseif event.event == "cancelled" then
    return "Kode: the install was cancelled; :KodeInstall goes on where it stopped.", levels.WARN
  elseif event.event == "error" then
    local lines = { "Kode: the server could not be installed: " .. (event.message or "?") }
    if event.fix then
      lines[#lines + 1] = "To fix it: " .. event.fix
    end
    if event.log then
      lines[#lines + 1] = "The log: " .. event.log
    end
    return table.concat(lines, "\n"), levels.ERROR
  end
end

--- After an install: the LSP config runs the installed server (unless `cmd` was set) and
--- starts for the open buffers.
---@param kode string
function M.use(kode)
  local config = require("kode.config")
  if config.cmd_configured then
    return
  end
  config.options.cmd = { kode, "lsp" }
  local lsp = require("kode.lsp")
  vim.lsp.config(lsp.NAME, { cmd = config.options.cmd })
  for _, client in ipairs(lsp.clients()) do
    client:stop()
  end
  vim.lsp.enable(lsp.NAME) -- starts a client for each open buffer
end

local running ---@type vim.SystemObj?

--- Runs the installer in the background; `on_done(event)` gets its last line (done,
--- error or cancelled) in the main loop.
---@param opts? { target?: string, source?: string, script?: string, python?: string, on_done?: fun(event: kode.InstallEvent) }
function M.run(opts)
  opts = opts or {}
  if running then
    return vim.notify("Kode: the server is being installed already (:KodeInstall cancel stops it)", vim.log.levels.WARN)
  end
  local python = opts.python
  if not python then
    local found = M.find_python()
    if not found then
      return vim.notify(
        ("Kode: no Python found to install the server with (looked for %s on PATH): install Python 3.11 or newer"):format(
          table.concat(M.PYTHONS, ", ")
        ),
        vim.log.levels.ERROR
      )
    end
    python = found.executable
  end
  local last ---@type kode.InstallEvent?
  local pending = ""
  local function on_line(line)
    local event = M.parse(line)
    if not event then
      return
    end
    if event.event == "done" or event.event == "error" or event.event == "cancelled" then
      last = event
    end
    local text, level = M.message(event)
    if text then
      vim.schedule(function()
        vim.notify(text, level, { title = "Kode install" })
      end)
    end
  end
  local argv = { python, opts.script or M.script(), opts.target or M.target(), opts.source or M.repository(), "--quiet" }
  local ok, obj = pcall(vim.system, argv, {
    text = true,
    stdout = function(_, data)
      if data then
        local lines = vim.split(pending .. data, "\n", { plain = true })
        pending = table.remove(lines)
        vim.tbl_map(on_line, lines)
      end
    end,
  }, function(result)
    vim.schedule(function()
      running = nil
      on_line(pending)
      if not last then -- it said nothing of how it ended: it crashed
        local stderr = vim.trim(result.stderr or "")
        last = { event = "error", message = ("the installer ended with exit status %d%s"):format(result.code, stderr ~= "" and ":\n" .. stderr or "") }
        vim.notify(M.message(last))
      end
      if last.event == "done" and last.kode then
        M.use(last.kode)
      end
      if opts.on_done then
        opts.on_done(last)
      end
    end)
  end)
  if not ok then
    return vim.notify(("Kode: could not run %s: %s"):format(python, tostring(obj)), vim.log.levels.ERROR)
  end
  running = obj
end

--- Stops a running install (SIGTERM: the installer stops its command; the next run goes on).
function M.cancel()
  if not running then
    return vim.notify("Kode: no install is running", vim.log.levels.INFO)
  end
  running:kill("sigterm")
end

return M
