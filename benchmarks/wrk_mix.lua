-- wrk script: POST the benchmark's review mix. The mix file (env WRK_MIX) has one
-- "path<TAB>body" line per request, bodies with the uid placeholder of
-- benchmarks/reviews.py. All requests are formatted once in init() (each mix entry with
-- COPIES distinct uids), so wrk's per-request work stays tiny and the client core is not
-- what limits the baseline; uids repeat after #entries * COPIES requests, which the
-- server does not care about. done() prints one JSON line for run.py.
local placeholder = "00000000%-0000%-4000%-8000%-00000000beef"
local COPIES = 10
local requests = {}
local counter = 0

init = function(args)
  local headers = {["Content-Type"] = "application/json"}
  local entries = {}
  for line in io.lines(os.getenv("WRK_MIX")) do
    local tab = line:find("\t", 1, true)
    entries[#entries + 1] = {line:sub(1, tab - 1), line:sub(tab + 1)}
  end
  for copy = 1, COPIES do
    for i, e in ipairs(entries) do
      local uid = string.format("00000000-0000-4000-8000-%012x", copy * 100000 + i)
      requests[#requests + 1] = wrk.format("POST", e[1], headers,
                                           (e[2]:gsub(placeholder, uid, 1)))
    end
  end
end

request = function()
  counter = counter + 1
  return requests[(counter % #requests) + 1]
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":{"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d},"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p999":%d,' ..
    '"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
