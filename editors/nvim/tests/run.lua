-- Headless tests of the Neovim plugin against the real server.
--
--   KODE_BIN=/path/to/.venv/bin/kode nvim -l editors/nvim/tests/run.lua
--
-- This Neovim drives a second one (`nvim --embed`, set up by child_init.lua) over RPC:
-- keys go in through nvim_input, so Insert mode, autocommands and timers behave as they
-- do for a person typing. The child runs the real `kode lsp` with the small model.
-- Prints one line per test and, last, exactly "N passed, N failed"; exits 1 on failure.

local here = vim.fn.fnamemodify(_G.arg[0], ":p:h")
local root = vim.fn.fnamemodify(here, ":h") -- editors/nvim
local STEP_MS = 90000 -- one step on a loaded 2-core machine

local tmp = vim.fn.tempname()
vim.fn.mkdir(tmp .. "/state", "p")
local stderr = {}
local chan = vim.fn.jobstart({
  vim.v.progpath,
  "--embed",
  "--headless",
  "-n",
  "-i",
  "NONE",
  "--noplugin",
  "-u",
  here .. "/child_init.lua",
}, {
  rpc = true,
  cwd = tmp,
  env = {
    KODE_NVIM_ROOT = root,
    XDG_CONFIG_HOME = tmp .. "/config",
    XDG_DATA_HOME = tmp .. "/data",
    XDG_STATE_HOME = tmp .. "/state",
    XDG_CACHE_HOME = vim.env.XDG_CACHE_HOME, -- the models live in the cache
  },
  on_stderr = function(_, data)
    vim.list_extend(stderr, data)
  end,
})
if chan <= 0 then
  io.stdout:write("could not start the child Neovim\n0 passed, 1 failed\n")
  os.exit(1)
end

---@return any
local function lua(code, ...)
  local result = vim.rpcrequest(chan, "nvim_exec_lua", code, { ... })
  if result == vim.NIL then
    return nil
  end
  return result
end

local function feed(keys)
  vim.rpcrequest(chan, "nvim_input", keys)
end

local function now_ms()
  return vim.uv.hrtime() / 1e6
end

--- The child's mode and last events, to explain a timeout.
local function context()
  local ok_, info = pcall(lua, [[
    local list = _G.kode_events
    return {
      mode = vim.api.nvim_get_mode().mode,
      ghost = T.ghost(),
      pending = require("kode.completion").pending(),
      events = vim.list_slice(list, math.max(1, #list - 11)),
    }
  ]])
  return ok_ and vim.inspect(info) or ("(child not answering: " .. tostring(info) .. ")")
end

--- Poll `probe` until it returns a truthy value (returned) or `ms` pass (error).
local function wait(what, ms, probe)
  local deadline = now_ms() + ms
  while true do
    local value = probe()
    if value then
      return value
    end
    if now_ms() > deadline then
      error(("timed out after %d ms waiting for %s; child state:\n%s"):format(ms, what, context()), 2)
    end
    vim.wait(25)
  end
end

local function sleep(ms)
  vim.wait(ms)
end

local function eq(actual, expected, what)
  if not vim.deep_equal(actual, expected) then
    error(("%s: expected %s, got %s"):format(what, vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

local function ok(value, what)
  if not value then
    error(what, 2)
  end
  return value
end

local function events()
  return lua("return _G.kode_events") or {}
end

--- The first event `name` after position `from` in the event list whose data matches.
local function find_event(from, name, match)
  local list = events()
  for i = from + 1, #list do
    local e = list[i]
    if e.event == name then
      local data = e.data or {}
      local fits = true
      for k, v in pairs(match or {}) do
        if data[k] ~= v then
          fits = false
        end
      end
      if fits then
        return data
      end
    end
  end
end

local function mark()
  return #events()
end

local function ghost()
  return lua("return T.ghost()")
end

local function buffer()
  return lua("return T.buffer()")
end

local function open(name, lines)
  lua("T.open(...)", tmp .. "/" .. name, lines)
  wait("the kode client to attach", STEP_MS, function()
    return lua("return T.ready()")
  end)
end

--- Enter Insert mode at the end of line `row` (1-based) and wait for the request it sends.
local function insert_at_end(row)
  local from = mark()
  feed(("<Esc>%dGA"):format(row))
  return wait("a textDocument/inlineCompletion request", STEP_MS, function()
    return find_event(from, "KodeRequest")
  end)
end

local FIB = {
  "def fibonacci(n):",
  '    """Return the n-th Fibonacci number."""',
  "    ",
}

-- Opening a dict at the end of a line: the small model lists entries for hundreds of tokens.
local LONG = {
  '"""HTTP helpers."""',
  "",
  "HTTP_STATUS_PHRASES = {",
}

local tests = {}
local function test(name, fn)
  tests[#tests + 1] = { name = name, fn = fn }
end

test("ghost text appears at the cursor and <Tab> accepts it", function()
  open("fib.py", FIB)
  local req = insert_at_end(3)
  local reply = wait("the reply", STEP_MS, function()
    return find_event(0, "KodeResponse", { id = req.id })
  end)
  eq(reply.status, "shown", "reply status")
  local shown = ok(ghost(), "no ghost-text extmark")
  local suggestion = lua("return require('kode.completion').suggestion()")
  eq(shown.text, suggestion.text, "ghost text")
  eq({ shown.row, shown.col }, { 2, 4 }, "ghost text position")
  ok(suggestion.text:match("%S"), "blank suggestion")
  -- The multi-line answer streams first (partialCompletions): each partial extends the last.
  local grown = {}
  for _, e in ipairs(events()) do
    if e.event == "KodePartial" and e.data.id == req.id then
      grown[#grown + 1] = e.data.text
    end
  end
  ok(#grown > 0 or vim.env.KODE_EXPECT_PARTIALS ~= "1", "no kode/inlineCompletionPartial drawn")
  for i = 2, #grown do
    ok(vim.startswith(grown[i], grown[i - 1]), "a partial does not extend the previous one")
  end

  local before = buffer()
  feed("<Tab>")
  local expected = before.text .. suggestion.text
  local after = wait("the suggestion to be inserted", 5000, function()
    local b = buffer()
    return b.text ~= before.text and b
  end)
  eq(after.text, expected, "buffer after <Tab>")
  local lines = vim.split(expected, "\n", { plain = true })
  eq({ after.row, after.col }, { #lines - 1, #lines[#lines] }, "cursor after <Tab>")
  eq(after.mode, "i", "mode after <Tab>")
  feed("<Esc>")
  wait("the status line to show the model", STEP_MS, function()
    local line = lua("return require('kode').statusline()")
    return line:match("llama%.cpp") and line:match("0%.5b")
  end)
end)

test("the status line shows the last answer, not the last generation", function()
  -- A one-token background preparation after a 13 s answer once read `176ms 10000tok/s`.
  local line = lua([[return require("kode.status").line({
    backend = "llama.cpp", model = "m.gguf",
    counters = { last = { totalMs = 176, ttftMs = 175.9, completionTokens = 1 } },
    lastCompletion = { answerMs = 13270.4, tokensPerS = 9.6 },
  }, true)]])
  eq(line, "kode: llama.cpp m 13270ms 10tok/s", "status line")
  line = lua([[return require("kode.status").line({
    backend = "llama.cpp", model = "m.gguf", lastCompletion = { answerMs = 0, tokensPerS = vim.NIL },
  }, true)]])
  eq(line, "kode: llama.cpp m 0ms", "status line of a one-token answer")
end)

test("a word and a line at a time", function()
  open("words.py", FIB)
  insert_at_end(3)
  ok(lua("return T.craft(...)", "alpha beta\n    gamma"), "no request to answer")
  eq(ghost().text, "alpha beta\n    gamma", "ghost text")
  feed("<C-Right>")
  wait("the word", 5000, function()
    return buffer().text:match("    alpha$")
  end)
  eq(ghost().text, " beta\n    gamma", "ghost text after a word")
  feed("<C-l>")
  wait("the line", 5000, function()
    return buffer().text:match("    alpha beta$")
  end)
  eq(ghost().text, "\n    gamma", "ghost text after a line")
  feed("<C-l>")
  wait("the last line", 5000, function()
    return buffer().text:match("alpha beta\n    gamma$")
  end)
  eq(ghost(), nil, "ghost text after everything was accepted")
  feed("<Esc>")
end)

test("typing cancels the in-flight request", function()
  lua("T.set_settings(...)", { maxTokens = 512, maxLines = 200, multiline = "always" })
  open("long.py", LONG)
  local cancelled = lua("return T.stats().counters.cancelled")
  local req = insert_at_end(3)
  sleep(300)
  ok(not find_event(0, "KodeResponse", { id = req.id }), "the request finished within 300 ms: nothing to cancel")
  local from = mark()
  feed("x")
  wait("KodeCancel for the request", 5000, function()
    return find_event(from, "KodeCancel", { id = req.id })
  end)
  ok(find_event(from, "LspRequest", { id = req.id, type = "cancel" }), "no $/cancelRequest sent")
  wait("the server to count the cancel", 15000, function()
    return lua("return T.stats().counters.cancelled") > cancelled
  end)
  feed("<Esc>")
  sleep(200)
  ok(not find_event(0, "KodeResponse", { id = req.id }), "a cancelled request was answered")
  lua("T.set_settings()")
end)

test("a reply for an older document version is dropped", function()
  lua("T.set_settings(...)", { maxTokens = 16 }) -- the stale reply comes back sooner
  open("stale.py", FIB)
  feed("<Esc>")
  -- Keep the plugin's own change handlers from cancelling: this checks the version test.
  lua("vim.o.eventignore = 'TextChanged,TextChangedI,CursorMoved,CursorMovedI'")
  local ok_, err = pcall(function()
    lua("vim.api.nvim_win_set_cursor(0, { 3, 4 })")
    ok(lua("return require('kode.completion').request()"), "request not sent")
    local req = lua("return require('kode.completion').pending()")
    lua("vim.api.nvim_buf_set_lines(0, 0, 0, false, { 'import math' })")
    local reply = wait("the reply", STEP_MS, function()
      return find_event(0, "KodeResponse", { id = req.id })
    end)
    eq(reply.status, "stale", "reply status")
    eq(ghost(), nil, "ghost text from a stale reply")

    -- The same with a non-empty reply crafted for the old version.
    lua("vim.api.nvim_win_set_cursor(0, { 4, 4 })")
    ok(lua("return require('kode.completion').request()"), "request not sent")
    local from = mark()
    lua("vim.api.nvim_buf_set_lines(0, 0, 1, false, { 'import os' })")
    ok(lua("return T.craft(...)", "return n"), "no request to answer")
    eq(find_event(from, "KodeResponse").status, "stale", "crafted reply status")
    eq(ghost(), nil, "ghost text from a crafted stale reply")
  end)
  lua("vim.o.eventignore = ''")
  lua("T.set_settings()")
  assert(ok_, err)
end)

test("partial notifications grow the ghost text", function()
  lua("T.set_settings(...)", { maxTokens = 512, maxLines = 200, multiline = "always" })
  open("partial.py", LONG)
  local req = insert_at_end(3)
  -- One RPC call, so that nothing the server sends can interleave.
  local seen = lua([[
    local seen = {}
    T.partial({ text = "100:" })
    seen[#seen + 1] = T.ghost().text
    T.partial({ text = "100: \"Continue\",\n    101:" })
    seen[#seen + 1] = T.ghost().text
    T.partial({ text = "WRONG REQUEST", requestId = -1 })
    seen[#seen + 1] = T.ghost().text
    local req = require("kode.completion").pending()
    T.partial({ text = "OLD VERSION", textDocument = { uri = vim.uri_from_bufnr(0), version = req.version - 1 } })
    seen[#seen + 1] = T.ghost().text
    seen[#seen + 1] = require("kode").accept()
    seen[#seen + 1] = T.buffer().text
    return seen
  ]])
  eq(seen[1], "100:", "first partial")
  eq(seen[2], '100: "Continue",\n    101:', "second partial")
  eq(seen[3], seen[2], "a partial of another request")
  eq(seen[4], seen[2], "a partial of an older version")
  eq(seen[5], true, "accept")
  eq(seen[6], table.concat(LONG, "\n") .. '100: "Continue",\n    101:', "buffer after accepting a partial")
  ok(find_event(0, "KodeCancel", { id = req.id }), "accepting a partial did not stop the stream")
  feed("<Esc>")
  lua("T.set_settings()")
end)

test("the suggestion goes away on a cursor move, <C-]> and leaving Insert mode", function()
  open("dismiss.py", FIB)
  -- <Esc> twice: the handlers must survive their first use.
  for _, keys in ipairs({ "<Left>", "<C-]>", "<Esc>", "<Esc>" }) do
    insert_at_end(3)
    ok(lua("return T.craft(...)", "return n"), "no request to answer")
    ok(ghost(), "no ghost text to dismiss")
    local before = buffer().text
    feed(keys)
    wait("the ghost text to go after " .. keys, 5000, function()
      return ghost() == nil
    end)
    eq(buffer().text, before, "buffer after " .. keys)
  end
end)

test("keys do what they did before when no suggestion shows", function()
  open("keys.py", { "x = 1" })
  lua("require('kode').disable()")
  local ok_, err = pcall(function()
    feed("<Esc>1GA<Tab><C-l>")
    wait("the fallback keys", 5000, function()
      return buffer().text == "x = 1   PREV"
    end)
  end)
  feed("<Esc>")
  lua("require('kode').enable()")
  assert(ok_, err)
end)

test(":checkhealth kode reports the server, its version, backend and model", function()
  local report = lua([[
    vim.cmd("checkhealth kode")
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    vim.cmd("bwipeout!")
    return text
  ]])
  ok(report:match("server: /[^\n]*kode %(cmd in setup%(%)%)"), "no executable in:\n" .. report)
  ok(report:match("server running %(client %d+%): kode %d+%.%d+%.%d+"), "no version in:\n" .. report)
  ok(report:match("backend: llama%.cpp"), "no backend in:\n" .. report)
  ok(report:match("model: qwen2%.5%-coder%-0%.5b"), "no model in:\n" .. report)
  ok(report:match("next edits: off"), "no next-edit line in:\n" .. report)
  -- The doctor's section: this machine's facts (a busy machine warns), each check a line.
  local plugin, doctor = report:match("^(.-)\nkode doctor[^\n]*\n(.*)$")
  ok(plugin and doctor, "no kode doctor section in:\n" .. report)
  ok(not plugin:match("ERROR"), "errors in:\n" .. report)
  ok(doctor:match("doctor %-%-json %-%-skip%-model"), "not run with --skip-model:\n" .. report)
  ok(doctor:match("OK[^\n]*python: Python 3%."), "no python check in:\n" .. report)
  ok(doctor:match("model small: "), "no model check in:\n" .. report)
  ok(not doctor:match("kode doctor failed"), "the doctor failed:\n" .. report)
end)

local DOCTOR_JSON = vim.json.encode({
  { name = "python", status = "OK", detail = "Python 3.11.7; Kode 0.1.0", fix = vim.NIL },
  { name = "machine load", status = "WARN", detail = "load 2.6 on 2 core(s)", fix = "close what keeps it busy" },
  { name = "model small", status = "FAIL", detail = "part 2 of 3 missing", fix = "kode models install small" },
})

test("kode doctor's JSON becomes the report: OK, WARN, FAIL and malformed output", function()
  local r = lua([[
    local doctor = require("kode.doctor")
    local health = require("kode.health")
    local shown = {}
    local saved = { ok = vim.health.ok, warn = vim.health.warn, error = vim.health.error }
    for level in pairs(saved) do
      vim.health[level] = function(msg, advice) shown[#shown + 1] = { level, msg, advice } end
    end
    local full = doctor.report({ code = 1, stdout = ..., stderr = "" })
    local malformed = doctor.report({ code = 1, stdout = "[{", stderr = "kode doctor: Python\nTraceback\nImportError: x\n" }, "kode doctor --json")
    pcall(health.show, full)
    pcall(health.show, malformed)
    for level, fn in pairs(saved) do vim.health[level] = fn end
    return {
      cmd = doctor.command({ "/venv/bin/kode", "lsp" }, false),
      cmd_python = doctor.command({ "python", "-m", "kode", "lsp", "--verbose" }, true),
      full = full,
      malformed = malformed,
      ok_only = doctor.report({ code = 0, stdout = '[{"name": "python", "status": "OK", "detail": "d", "fix": null}]' }),
      empty = doctor.report({ code = 0, stdout = "" }).error,
      not_list = doctor.report({ code = 0, stdout = "{}" }).error,
      bad_status = doctor.report({ code = 0, stdout = '[{"name": "x", "status": "BAD", "detail": "d"}]' }).error,
      timed_out = doctor.report({ code = 124, signal = 15, stdout = "" }).error,
      old = doctor.report({ code = 2, stdout = "", stderr = "invalid choice: 'doctor' (choose from 'lsp')" }).error,
      shown = shown,
      levels = vim.log.levels,
    }
  ]], DOCTOR_JSON)
  eq(r.cmd, { "/venv/bin/kode", "doctor", "--json", "--skip-model" }, "the health check's command")
  eq(r.cmd_python, { "python", "-m", "kode", "doctor", "--json" }, ":KodeDoctor's command")
  eq(r.full.lines, {
    "OK    python: Python 3.11.7; Kode 0.1.0",
    "WARN  machine load: load 2.6 on 2 core(s)",
    "      fix: close what keeps it busy",
    "FAIL  model small: part 2 of 3 missing",
    "      fix: kode models install small",
    "Kode setup: 1 problem (model small); 1 warning (machine load)",
  }, "the lines")
  eq(r.full.level, r.levels.ERROR, "a FAIL's level")
  eq(r.ok_only.summary, "Kode setup: all 1 check OK", "all OK")
  eq(r.ok_only.level, r.levels.INFO, "all OK's level")
  eq(r.malformed.error, "its output is not JSON (exit status 1)", "malformed output")
  eq(r.malformed.lines, {
    "kode doctor --json: its output is not JSON (exit status 1)",
    "  kode doctor: Python",
    "  Traceback",
    "  ImportError: x",
  }, "malformed output's lines")
  eq(r.empty, "it printed no report (exit status 0)", "no output")
  eq(r.not_list, "its output is not a list of checks (exit status 0)", "an object")
  eq(r.bad_status, "check 1 of its output is not {name, status: OK|WARN|FAIL, detail, fix} (exit status 0)", "a bad status")
  eq(r.timed_out, "it printed no report (timed out)", "a timeout")
  ok(r.old:match("older than `kode doctor`"), "an old kode: " .. r.old)
  eq(r.shown, {
    { "ok", "python: Python 3.11.7; Kode 0.1.0" },
    { "warn", "machine load: load 2.6 on 2 core(s)", { "close what keeps it busy" } },
    { "error", "model small: part 2 of 3 missing", { "kode models install small" } },
    { "error", "kode doctor failed: its output is not JSON (exit status 1)", { "  kode doctor: Python", "  Traceback", "  ImportError: x" } },
  }, "what :checkhealth shows")
end)

test(":KodeDoctor runs the full check in the background and notifies the result", function()
  local script = tmp .. "/fake-kode"
  vim.fn.writefile({
    "#!/bin/sh",
    'echo "$*" > ' .. tmp .. "/fake-kode.args",
    "cat <<'EOF'",
    DOCTOR_JSON,
    "EOF",
    "exit 1",
  }, script)
  vim.fn.setfperm(script, "rwxr-xr-x")
  lua([[
    _G.kode_notes = {}
    _G.kode_notify = vim.notify
    vim.notify = function(msg, level) table.insert(_G.kode_notes, { msg = msg, level = level }) end
    local config = require("kode.config").options
    _G.kode_cmd = config.cmd
    config.cmd = { ..., "lsp" }
    vim.cmd("KodeDoctor")
  ]], script)
  local ok_, err = pcall(function()
    local notes = wait("the doctor's result", 10000, function()
      local list = lua("return _G.kode_notes")
      return list and #list >= 2 and list
    end)
    ok(notes[1].msg:match("timing a tiny completion"), "no start message: " .. vim.inspect(notes))
    eq(notes[2].level, 4, "the result's level (ERROR)")
    ok(notes[2].msg:match("^OK    python: Python 3%.11%.7"), "no lines: " .. notes[2].msg)
    ok(notes[2].msg:match("\n      fix: kode models install small\n"), "no fix: " .. notes[2].msg)
    ok(notes[2].msg:match("Kode setup: 1 problem %(model small%); 1 warning %(machine load%)$"), notes[2].msg)
    eq(vim.fn.readfile(tmp .. "/fake-kode.args"), { "doctor --json" }, "the arguments (no --skip-model)")
    lua([[require("kode.config").options.cmd = { "/nonexistent/kode", "lsp" }; vim.cmd("KodeDoctor")]])
    local last = lua("return _G.kode_notes[#_G.kode_notes]")
    ok(last.msg:match("server executable was not found: /nonexistent/kode"), "missing server: " .. last.msg)
  end)
  lua([[
    vim.notify = _G.kode_notify
    require("kode.config").options.cmd = _G.kode_cmd
  ]])
  assert(ok_, err)
end)

-- Next edits (kode.next_edit) against fake_server.lua: a fake "kode" in the child whose
-- `kode/inlineEdit` answers wait for the test, so that every order of events is chosen
-- here, not by a model's speed. A rename at one use (`n` -> `count`) and its next use.
local SHAPES = {
  "def scale(n, k):",
  "    total = n * k",
  "    return total + n",
}

--- A scratch buffer of `lines` with the fake client attached, next edits on.
local function fake_open(name, lines)
  lua("F.open(...)", tmp .. "/next-edit-" .. name, lines) -- not the other tests' files
  wait("the fake kode client", 10000, function()
    return lua("return F.ready()")
  end)
  lua("require('kode.config').options.settings.nextEdits = true")
end

--- Run `fn` with next edits on, and leave them off (as the other tests expect) either way.
local function with_next_edits(fn)
  local ok_, err = pcall(fn)
  pcall(feed, "<Esc>")
  lua([[
    require("kode.config").options.settings.nextEdits = nil
    require("kode.config").options.next_edit_debounce_ms = require("kode.config").defaults().next_edit_debounce_ms
    vim.o.eventignore = ""
    package.loaded.cmp = nil
    require("kode").enable()
    require("kode.next_edit").dismiss()
    F.close()
  ]])
  local fakes_left = lua([[
    local n = 0
    for _, client in ipairs(vim.lsp.get_clients({ name = "kode" })) do
      n = n + (type(client.config.cmd) == "function" and 1 or 0)
    end
    return n
  ]])
  eq(fakes_left, 0, "fake kode clients left for the other tests")
  assert(ok_, err)
end

--- The `n`-th `kode/inlineEdit` request, once it was sent.
local function edit_request(n)
  return wait(("kode/inlineEdit request %d"):format(n), 5000, function()
    local list = lua("return F.edit_requests()")
    return #list >= n and list[n]
  end)
end

local function drawn()
  return lua("return F.drawn()")
end

local function line(row)
  return lua("return vim.api.nvim_buf_get_lines(0, ..., ... + 1, true)[1]", row - 1)
end

local function version()
  return lua("return vim.lsp.util.buf_versions[vim.api.nvim_get_current_buf()]")
end

--- The next use's edit (`n` -> `count` on line 2) for document version `v`, answered to
--- request `id` (default: the latest held); waits for it to be drawn.
local function answer_next_use(v, id)
  ok(
    lua("return F.answer({ F.edit(...) }, select(7, ...))", v, 1, 12, 1, 13, "count", id),
    "no request held: " .. vim.inspect(lua("return { F.requests, F.cancelled, _G.kode_events }"))
  )
  return wait("the next edit drawn", 5000, function()
    local d = drawn()
    return d.struck and d.insert and d
  end)
end

--- Rename at the first use in Normal mode (`ciw`), back to Normal mode; wait for the ask.
local function rename_first_use()
  feed("<Esc>gg0fnciwcount<Esc>")
  local req = edit_request(1)
  eq(line(1), "def scale(count, k):", "the rename")
  return req
end

test("next edit: shown after an edit and a pause; <Tab> jumps, <Tab> applies, u undoes it", function()
  with_next_edits(function()
    fake_open("shapes.py", SHAPES)
    local req = rename_first_use()
    eq(req.params.textDocument.version, version(), "the document version asked about")
    eq(req.params.textDocument.uri, lua("return vim.uri_from_bufnr(0)"), "the document")
    eq(req.params.position, { line = 0, character = 14 }, "the cursor sent")
    local d = answer_next_use(req.params.textDocument.version)
    eq(d.struck, { row = 1, col = 12, end_row = 1, end_col = 13 }, "what goes, struck through")
    eq(d.insert, { row = 1, col = 13, text = "count", hl = "KodeNextEditInsert" }, "what comes")
    ok(lua("return require('kode').statusline()"):match("next edit: line 2$"), "no hint in the status line")

    feed("<Tab>")
    wait("the jump", 5000, function()
      local b = buffer()
      return b.row == 1 and b.col == 12
    end)
    eq(line(2), "    total = n * k", "the text after the jump")
    ok(drawn().struck, "the next edit went away on the jump")
    feed("<Tab>")
    wait("the edit applied", 5000, function()
      return line(2) == "    total = count * k"
    end)
    eq(drawn(), { struck = false, insert = false }, "the next edit after it was applied")
    local b = buffer()
    eq({ b.row, b.col, b.mode }, { 1, 16, "n" }, "the cursor after applying: on the last character")
    -- The change asks again: the next place after this one.
    local again = edit_request(2)
    eq(again.params.textDocument.version, version(), "the version asked about after applying")

    feed("u")
    wait("the undo", 5000, function()
      return line(2) == "    total = n * k"
    end)
    eq(line(1), "def scale(count, k):", "one undo step took the rename too")
  end)
end)

test("next edit: in Insert mode <Tab> jumps (no completion asked there), applies, undone alone", function()
  with_next_edits(function()
    fake_open("insert.py", SHAPES)
    feed("<Esc>gg0fnciwcount") -- stays in Insert mode: asked after the pause
    local req = edit_request(1)
    eq(req.params.position, { line = 0, character = 15 }, "the cursor sent from Insert mode")
    answer_next_use(req.params.textDocument.version)
    -- A completion at the place the jump goes to would hide the edit (the completion wins).
    lua("F.ghost = 'GHOST'")
    local from = mark()
    feed("<Tab>")
    wait("the jump", 5000, function()
      local b = buffer()
      return b.row == 1 and b.col == 12 and b.mode == "i"
    end)
    sleep(200) -- a completion would be asked 30 ms after the cursor came to rest
    ok(not find_event(from, "KodeRequest"), "a completion was asked where the jump went")
    ok(drawn().struck, "the next edit went away on the jump")
    feed("<Tab>")
    wait("the edit applied", 5000, function()
      return line(2) == "    total = count * k"
    end)
    local b = buffer()
    eq({ b.row, b.col, b.mode }, { 1, 17, "i" }, "the cursor after applying: after the new text")
    lua("F.ghost = nil")
    feed("<Esc>u")
    wait("the undo", 5000, function()
      return line(2) == "    total = n * k"
    end)
    eq(line(1), "def scale(count, k):", "the rename typed before was undone with the edit")
  end)
end)

test("next edit: an answer for a document version the buffer has left is dropped", function()
  with_next_edits(function()
    fake_open("stale.py", SHAPES)
    local req = rename_first_use()
    -- The buffer moves on before the answer, with the change handler kept out of the
    -- way (it would cancel the request): this checks the version test itself.
    lua("vim.o.eventignore = 'TextChanged,TextChangedI'")
    lua("vim.api.nvim_buf_set_lines(0, 3, 3, false, { '# more' })")
    local from = mark()
    -- Its edit names no version: only the request's own tells that it is stale.
    ok(lua([[
      local edit = F.edit(0, 1, 12, 1, 13, "count")
      edit.textDocument.version = nil
      return F.answer({ edit })
    ]]), "not held")
    local reply = wait("the answer", 5000, function()
      return find_event(from, "KodeNextEditResponse", { id = req.id })
    end)
    eq(reply.status, "stale", "answer status")
    eq(drawn(), { struck = false, insert = false }, "drawn from a stale answer")
    lua("vim.o.eventignore = ''")

    -- Asked for the current version, answered with an edit made for an older one.
    lua("vim.cmd('KodeNextEdit')")
    local manual = edit_request(2)
    eq(manual.params.textDocument.version, version(), ":KodeNextEdit's version")
    from = mark()
    lua("F.answer({ F.edit(...) })", version() - 1, 1, 12, 1, 13, "count")
    reply = wait("the answer", 5000, function()
      return find_event(from, "KodeNextEditResponse", { id = manual.id })
    end)
    eq(reply.status, "stale", "an edit for an older version")
    eq(drawn(), { struck = false, insert = false }, "drawn from an edit for an older version")

    -- The same edit for the current version shows.
    lua("vim.cmd('KodeNextEdit')")
    answer_next_use(edit_request(3).params.textDocument.version)
  end)
end)

test("next edit: <Tab> is the menu's or the snippet's when one wants it", function()
  with_next_edits(function()
    fake_open("menu.py", SHAPES)
    local req = rename_first_use()
    answer_next_use(req.params.textDocument.version)
    feed("3GA")
    wait("Insert mode", 5000, function()
      return buffer().mode == "i"
    end)
    ok(drawn().struck, "entering Insert mode hid the next edit")

    -- Each time <Tab> must do what it did before Kode (insert 4 spaces), not jump.
    local function tab_falls_back(what)
      local before = line(3)
      feed("<Tab>")
      wait("<Tab> to insert spaces with " .. what, 5000, function()
        return line(3) == before .. "    "
      end)
      eq(buffer().row, 2, "the cursor jumped with " .. what)
      eq(line(2), "    total = n * k", "the edit applied with " .. what)
    end
    local function show_again()
      lua("vim.cmd('KodeNextEdit')")
      local n = #lua("return F.edit_requests()")
      answer_next_use(version(), edit_request(n).id)
    end

    -- The built-in popup menu.
    lua([[
      vim.o.completeopt = "menu,menuone,noinsert,noselect"
      vim.fn.complete(vim.fn.col("."), { "alpha", "beta" })
    ]])
    wait("the popup menu", 5000, function()
      return lua("return vim.fn.pumvisible()") == 1
    end)
    ok(drawn().struck, "the next edit went away when the menu opened")
    tab_falls_back("the popup menu")

    -- nvim-cmp's menu (its `visible()`).
    show_again()
    lua("package.loaded.cmp = { visible = function() return true end }")
    tab_falls_back("nvim-cmp's menu")
    lua("package.loaded.cmp = nil")

    -- A snippet with a place to jump to: <Tab> jumps there (Neovim's own <Tab> mapping).
    -- Typing over the first placeholder leaves Select mode for Insert mode in it.
    lua("vim.snippet.expand('f(${1:a}, ${2:b})')")
    feed("x")
    wait("Insert mode in the snippet", 5000, function()
      return buffer().mode == "i" and line(3):match("f%(x, b%)$")
    end)
    show_again()
    feed("<Tab>")
    wait("the snippet's jump", 5000, function()
      return lua("return vim.api.nvim_get_mode().mode") == "s"
    end)
    eq(line(2), "    total = n * k", "the edit applied in a snippet")
    feed("<Esc>")
    lua("vim.snippet.stop()")

    -- With none of them, <Tab> jumps.
    feed("<Esc>3GA")
    wait("Insert mode", 5000, function()
      return buffer().mode == "i"
    end)
    show_again()
    feed("<Tab>")
    wait("the jump", 5000, function()
      local b = buffer()
      return b.row == 1 and b.col == 12
    end)
  end)
end)

test("next edit: any edit and <Esc> in Normal mode dismiss it; leaving Insert mode does not", function()
  with_next_edits(function()
    fake_open("dismiss.py", SHAPES)
    local req = rename_first_use()
    answer_next_use(req.params.textDocument.version)
    local function show_again()
      lua("vim.cmd('KodeNextEdit')")
      local n = #lua("return F.edit_requests()")
      answer_next_use(version(), edit_request(n).id)
    end
    local function gone(what)
      wait("the next edit to go after " .. what, 5000, function()
        return not drawn().struck
      end)
      eq(lua("return require('kode.next_edit').shown()"), nil, "shown() after " .. what)
    end

    -- An edit in Normal mode: it goes at once, and the pause after it asks again.
    local n = #lua("return F.edit_requests()")
    feed("3G$x")
    gone("x")
    edit_request(n + 1)

    show_again()
    feed("<Esc>")
    gone("<Esc> in Normal mode")

    show_again()
    feed("A")
    wait("Insert mode", 5000, function()
      return buffer().mode == "i"
    end)
    feed("<Esc>")
    wait("Normal mode", 5000, function()
      return buffer().mode == "n"
    end)
    sleep(100) -- the scheduled dismissal, if <Esc> in Insert mode made one
    ok(drawn().struck, "leaving Insert mode dismissed the next edit")
    feed("<Esc>")
    gone("the second <Esc>")

    show_again()
    feed("A")
    feed("z")
    gone("typing")
    feed("<Esc>")

    -- :Kode disable hides it, and no edit asks for another while completions are off.
    show_again()
    lua("vim.cmd('Kode disable')")
    gone(":Kode disable")
    n = #lua("return F.edit_requests()")
    feed("3G$x")
    sleep(600) -- past the pause (250 ms) after the edit
    eq(#lua("return F.edit_requests()"), n, "requests while off")
    lua("vim.cmd('Kode enable')")

    -- With no next edit, <Tab> in Normal mode is <C-i> again: forward in the jumplist.
    feed("ggG<C-o>")
    wait("<C-o> back to line 1", 5000, function()
      return buffer().row == 0
    end)
    feed("<Tab>")
    wait("<Tab> forward to the last line", 5000, function()
      return buffer().row == 2
    end)
  end)
end)

test("next edit: an edit cancels the request in flight; its late answer is dropped", function()
  with_next_edits(function()
    fake_open("cancel.py", SHAPES)
    local req = rename_first_use()
    lua("F.late = true") -- the answer crosses the cancel
    -- A long pause: the cancel must come with the edit, not with the next request.
    lua("require('kode.config').options.next_edit_debounce_ms = 1500")
    local from = mark()
    feed("3G$x")
    wait("$/cancelRequest for the request", 5000, function()
      return vim.tbl_contains(lua("return F.cancelled"), req.id)
    end)
    eq(#lua("return F.edit_requests()"), 1, "requests when the first was cancelled")
    ok(find_event(from, "KodeNextEditCancel", { id = req.id }), "no KodeNextEditCancel")
    lua("F.answer({ F.edit(...) }, select(7, ...))", req.params.textDocument.version, 1, 12, 1, 13, "count", req.id)
    local again = edit_request(2) -- after the pause
    eq(again.params.textDocument.version, version(), "the new request's version")
    ok(not find_event(from, "KodeNextEditResponse", { id = req.id }), "the cancelled request's answer was taken")
    eq(drawn(), { struck = false, insert = false }, "drawn from a cancelled request")
    answer_next_use(again.params.textDocument.version, again.id)
  end)
end)

test("next edit: hidden while a completion's ghost text shows, back when it goes", function()
  with_next_edits(function()
    fake_open("ghost.py", SHAPES)
    local req = rename_first_use()
    answer_next_use(req.params.textDocument.version)
    lua("F.ghost = 'GHOST'")
    feed("3GA")
    wait("the ghost text", 5000, function()
      return ghost() and ghost().text == "GHOST"
    end)
    eq(drawn(), { struck = false, insert = false }, "the next edit beside the ghost text")
    lua("F.ghost = nil")
    feed("<C-]>")
    wait("the next edit back", 5000, function()
      return drawn().struck
    end)
    eq(ghost(), nil, "ghost text after <C-]>")
    feed("<Tab>")
    wait("the jump", 5000, function()
      local b = buffer()
      return b.row == 1 and b.col == 12
    end)
  end)
end)

test("the installer's lines become one notification per step", function()
  local r = lua([[
    local install = require("kode.install")
    local function shown(event)
      local text, level = install.message(event)
      return { text or vim.NIL, level or vim.NIL }
    end
    return {
      repository = install.repository(),
      parsed = install.parse('{"event": "skip", "step": "venv", "index": 1, "total": 5}'),
      not_json = install.parse("Collecting pip") or vim.NIL,
      step = shown({ event = "step", index = 3, total = 5, title = "Building llama.cpp for this CPU (minutes)" }),
      skip = shown({ event = "skip", index = 1, total = 5, title = "Making the environment" }),
      progress = shown({ event = "progress", step = "llama", message = "[1/9] ggml.c" }),
      start = shown({ event = "start", target = "/d", log = "/d/install.log", version = "0.1.0" }),
      done = shown({ event = "done", version = "0.1.0", seconds = 372.4, kode = "/d/current/bin/kode" }),
      error = shown({ event = "error", message = "no C and no C++ compiler on PATH", fix = "sudo apt install build-essential", log = "/d/install.log" }),
      cancelled = shown({ event = "cancelled" }),
    }
  ]])
  ok(vim.uv.fs_stat(r.repository .. "/editors/install/kode_install.py"), "not the repository: " .. r.repository)
  eq(r.parsed.event, "skip", "a parsed line")
  eq(r.not_json, vim.NIL, "pip's output is no event")
  eq(r.step, { "Kode install 3/5: Building llama.cpp for this CPU (minutes)", vim.log.levels.INFO }, "a step")
  eq(r.skip, { "Kode install 1/5: Making the environment (done already)", vim.log.levels.INFO }, "a skipped step")
  eq(r.progress, { vim.NIL, vim.NIL }, "progress lines are the log's")
  eq(r.start, { vim.NIL, vim.NIL }, "the start is the first step's line")
  eq(r.done, { "Kode: the server is installed (Kode 0.1.0, in 6 min 12 s)", vim.log.levels.INFO }, "done")
  eq(r.error, {
    "Kode: the server could not be installed: no C and no C++ compiler on PATH\nTo fix it: sudo apt install build-essential\nThe log: /d/install.log",
    vim.log.levels.ERROR,
  }, "an error")
  eq(r.cancelled[2], vim.log.levels.WARN, "cancelled")
end)

--- Runs :KodeInstall's installer with the fake steps (tests/fakes/install_steps.py) in the
--- child and waits for its end; returns the notifications and the last event.
local function fake_install(env, while_running)
  lua([[
    local env = ...
    _G.kode_notes = {}
    _G.kode_notify = _G.kode_notify or vim.notify
    vim.notify = function(msg, level) table.insert(_G.kode_notes, { msg = msg, level = level }) end
    for name, value in pairs(env) do vim.env[name] = value ~= "" and value or nil end
    local install = require("kode.install")
    _G.kode_install_done = nil
    install.run({
      script = install.repository() .. "/tests/fakes/install_steps.py",
      on_done = function(event) _G.kode_install_done = event end,
    })
  ]], env)
  local ok_, err = pcall(function()
    if while_running then
      while_running()
    end
    wait("the install's end", STEP_MS, function()
      return lua("return _G.kode_install_done")
    end)
  end)
  local result = lua([[
    vim.notify = _G.kode_notify
    return { notes = _G.kode_notes, last = _G.kode_install_done }
  ]])
  assert(ok_, err)
  return result
end

local function texts(notes)
  return vim.tbl_map(function(note)
    return note.msg
  end, notes)
end

test(":KodeInstall notifies each step, can be cancelled, then goes on and completes", function()
  local target = lua("return require('kode.install').target()")
  local cancelled = fake_install({ KODE_TEST_BLOCK = "1", KODE_TEST_SERVER = vim.env.KODE_BIN or "" }, function()
    wait("the blocking step", STEP_MS, function()
      return vim.tbl_contains(texts(lua("return _G.kode_notes")), "Kode install 3/5: Blocking")
    end)
    lua([[vim.cmd("KodeInstall cancel")]])
  end)
  eq(cancelled.last.event, "cancelled", "the last line")
  local shown = texts(cancelled.notes)
  eq(shown, {
    "Kode install 1/5: Making the environment",
    "Kode install 2/5: Fetching",
    "Kode install 3/5: Blocking",
    "Kode: the install was cancelled; :KodeInstall goes on where it stopped.",
  }, "the notifications")
  ok(lua("return require('kode.install').installed()") == nil, "a cancelled install is used")
  local report = lua([[
    vim.cmd("checkhealth kode")
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    vim.cmd("bwipeout!")
    return text
  ]])
  ok(report:match("an install in " .. vim.pesc(target) .. " is not complete"), "checkhealth:\n" .. report)
  ok(report:match(":KodeInstall goes on where it stopped"), "checkhealth's advice:\n" .. report)

  local done = fake_install({ KODE_TEST_BLOCK = "" })
  eq(done.last.event, "done", "the last line")
  shown = texts(done.notes)
  eq(vim.list_slice(shown, 1, 5), {
    "Kode install 1/5: Making the environment (done already)",
    "Kode install 2/5: Fetching (done already)",
    "Kode install 3/5: Blocking",
    "Kode install 4/5: Failing",
    "Kode install 5/5: Finishing",
  }, "the resumed install")
  ok(shown[6]:match("^Kode: the server is installed %(Kode 0%.1%.0, in %d+ s%)$"), shown[6])
  eq(#shown, 6, "notifications: " .. vim.inspect(shown))
  eq(lua("return require('kode.install').installed()"), target .. "/current/bin/kode", "the installed server")
  eq(lua("return require('kode.config').options.cmd[1]"), vim.env.KODE_BIN or "kode", "a configured cmd stays")
end)

test("without cmd, the plugin starts the installed server", function()
  local r = lua([[
    local config, install = require("kode.config"), require("kode.install")
    local kept = { cmd = config.options.cmd, configured = config.cmd_configured }
    _G.kode_kept = kept
    config.cmd_configured = false
    install.use(install.installed())
    return { cmd = vim.lsp.config.kode.cmd, command = install.command() }
  ]])
  local installed = lua("return require('kode.install').installed()")
  eq(r.cmd, { installed, "lsp" }, "the LSP config's cmd")
  eq(r.command, { installed, "lsp" }, "the command without cmd")
  local ok_, err = pcall(wait, "the installed server to start", STEP_MS, function()
    return lua([[
      for _, client in ipairs(vim.lsp.get_clients({ name = "kode" })) do
        if client.initialized and client.config.cmd[1] == require("kode.install").installed() then
          return true
        end
      end
      return false
    ]])
  end)
  lua([[
    local config, kept = require("kode.config"), _G.kode_kept
    config.cmd_configured = kept.configured
    config.options.cmd = kept.cmd
    vim.lsp.config("kode", { cmd = kept.cmd })
  ]])
  assert(ok_, err)
end)

test("with no server anywhere, setup() says so once, names :KodeInstall and enables nothing", function()
  -- A fresh Neovim: no cmd, nothing installed in its data folder, no kode on PATH.
  local script, out = tmp .. "/no-server.lua", tmp .. "/no-server.json"
  vim.fn.writefile({
    ("vim.opt.runtimepath:prepend(%q)"):format(root),
    "local notes = {}",
    "vim.notify = function(msg, level) table.insert(notes, { msg = msg, level = level }) end",
    'require("kode").setup({})',
    "local result = { notes = notes, enabled = vim.lsp.is_enabled('kode'), cmd = require('kode.config').options.cmd }",
    ("vim.fn.writefile({ vim.json.encode(result) }, %q)"):format(out),
  }, script)
  local done = vim.system({ vim.v.progpath, "--headless", "--clean", "-c", "luafile " .. script, "-c", "qa!" }, {
    env = { PATH = "/usr/bin:/bin", XDG_DATA_HOME = tmp .. "/no-server-data" },
  }):wait(60000)
  eq(done.code, 0, "the fresh Neovim's exit status (" .. (done.stderr or "") .. ")")
  local r = vim.json.decode(table.concat(vim.fn.readfile(out), "\n"))
  eq(r.cmd, { "kode", "lsp" }, "the command without cmd or an install")
  eq(r.enabled, false, "the LSP config is enabled without a server")
  eq(#r.notes, 1, "notifications: " .. vim.inspect(r.notes))
  eq(r.notes[1].msg, "Kode: no server (kode not found): run :KodeInstall, or set cmd", "the message")
  eq(r.notes[1].level, vim.log.levels.WARN, "its level")
end)

test("next edit: lines to add show as virtual lines; lines to delete at the end go whole", function()
  with_next_edits(function()
    fake_open("lines.py", SHAPES)
    local req = rename_first_use()
    -- A line added after line 2 (the insertion ends its line: nothing inline).
    ok(lua("return F.answer({ F.edit(...) })", req.params.textDocument.version, 1, 17, 1, 17, "\n    total += 1"), "not held")
    local d = wait("the lines drawn", 5000, function()
      local found = drawn()
      return found.insert and found
    end)
    eq(d.struck, false, "struck text of an insertion")
    eq(d.insert, { row = 1, col = 17, text = "\n    total += 1", hl = "KodeNextEditInsert" }, "the added line")
    feed("<Tab>")
    wait("the jump", 5000, function()
      return buffer().row == 1
    end)
    feed("<Tab>")
    wait("the line added", 5000, function()
      return #lua("return vim.api.nvim_buf_get_lines(0, 0, -1, true)") == 4
    end)
    eq(line(3), "    total += 1", "the added line")
    eq(line(4), "    return total + n", "the line after it")

    -- The last line deleted through the end of the document (LSP: up to line 4, col 0).
    lua("vim.cmd('KodeNextEdit')")
    local n = #lua("return F.edit_requests()")
    lua("F.answer({ F.edit(...) }, select(7, ...))", version(), 3, 0, 4, 0, "", edit_request(n).id)
    d = wait("the deletion drawn", 5000, function()
      local found = drawn()
      return found.struck and found
    end)
    eq(d.struck, { row = 2, col = 14, end_row = 3, end_col = 20 }, "the struck span")
    eq(d.insert, false, "text to come of a deletion")
    feed("<Tab>")
    wait("the jump", 5000, function()
      return buffer().row == 2
    end)
    feed("<Tab>")
    wait("the deletion", 5000, function()
      return #lua("return vim.api.nvim_buf_get_lines(0, 0, -1, true)") == 3
    end)
    eq(lua("return vim.api.nvim_buf_get_lines(0, 0, -1, true)"), {
      "def scale(count, k):",
      "    total = n * k",
      "    total += 1",
    }, "the buffer after the deletion")
  end)
end)

-- KODE_NVIM_TESTS: a Lua pattern; only the tests whose names match it run.
local only = vim.env.KODE_NVIM_TESTS

local passed, failed = 0, 0
for i, t in ipairs(tests) do
  if not only or only == "" or t.name:match(only) then
    local started = now_ms()
    local success, err = xpcall(t.fn, debug.traceback)
    local took = ("(%.1f s)"):format((now_ms() - started) / 1000)
    if success then
      passed = passed + 1
      io.stdout:write(("ok %d - %s %s\n"):format(i, t.name, took))
    else
      failed = failed + 1
      io.stdout:write(("not ok %d - %s %s\n  %s\n"):format(i, t.name, took, tostring(err):gsub("\n", "\n  ")))
      pcall(feed, "<Esc>")
    end
  end
end

if failed > 0 and #stderr > 1 then
  io.stdout:write("child stderr:\n  " .. table.concat(stderr, "\n  ") .. "\n")
end
pcall(vim.rpcrequest, chan, "nvim_command", "qall!")
vim.fn.jobwait({ chan }, 5000)
pcall(vim.fn.jobstop, chan)
vim.fn.delete(tmp, "rf")
io.stdout:write(("%d passed, %d failed\n"):format(passed, failed))
io.stdout:flush()
os.exit(failed == 0 and 0 or 1)
