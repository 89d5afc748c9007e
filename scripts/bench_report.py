#!/usr/bin/python3
"""Prints scripts/bench's report: the markdown table of the README's
Performance section, from the raw results scripts/bench wrote.

  bench_report.py RESULTS MEMORY REDIS_SERVERS WAVE DATE MACHINE COMMAND REPS DUR SLOW_DUR NGINX_WORKERS VERSIONS CLK_TCK

RESULTS has one line per measured run (one wrk, or one per proxy of a target of
several): label, target, repetition, connections, then key=value fields
(requests, duration_us, p50_us, p99_us, status_err, socket_err, proxy_ticks,
redis_each, rss_kib, stored_kib), tab-separated. redis_each is the CPU ticks
of each store server process behind the target (redis-servers, or PostgreSQL's
processes), comma-separated ("-": none).
MEMORY has one line per store of scenario 6: target|records|measure|delta|rss|evictions.
WAVE has one line per target of scenario 5's first wave: target|idle_kib|peak_kib|answered=A failed=F.
REDIS_SERVERS has one line per target with store servers: target|what they are
("redis-server", "3 masters", "master+replica", "postgres": its processes, summed).
"""
import sys, statistics
results, memory, redis_servers, wave, date, machine, command, reps, dur, slow_dur, nginx_workers, versions, \
    clk = sys.argv[1:]
tick_us = 1e6 / int(clk)
runs = {}      # (label, target) -> [run]
order = []
for line in open(results):
    label, target, rep, conns, kv, extra = line.rstrip("\n").split("\t")
    r = dict(x.split("=") for x in (kv + " " + extra).split())
    each = r.pop("redis_each", "-")
    r = {k: float(v) for k, v in r.items()}
    r["redis_each"] = [] if each == "-" else [float(x) for x in each.split(",")]
    r["rep"] = int(rep); r["conns"] = int(conns)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    if (label, target) not in runs:
        runs[(label, target)] = []
        order.append((label, target))
    runs[(label, target)].append(r)

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def ms(us):
    return "–" if us is None else f"{us / 1000:.2f} ms" if us < 100000 else f"{us / 1e6:.3f} s"

def num(x, fmt):
    return "–" if x is None else format(x, fmt)

kinds = dict(l.strip().split("|", 1) for l in open(redis_servers) if l.strip())

def redis_cpu(target, rs):
    """The redis-servers' CPU µs per request: the median of the per-run sums, and
    for more than one server each one's median ("3 masters: a+b+c")."""
    per = [[t * tick_us / r["requests"] for t in r["redis_each"]]
           for r in rs if r["requests"] and r["redis_each"]]
    if not per:
        return "–"
    text = num(med([sum(p) for p in per]), ".1f")
    if kinds.get(target) == "postgres":
        return text + " (%d PostgreSQL processes)" % len(per[0])
    if len(per[0]) > 1:
        text += " (%s: %s)" % (kinds.get(target, "%d servers" % len(per[0])),
                               "+".join(num(med([p[i] for p in per]), ".1f")
                                        for i in range(len(per[0]))))
    return text

print(f"Measured {date} on {machine}; `{command}`.  ")
print(f"{versions}; nginx `worker_processes {nginx_workers}`. "
      f"Medians of {reps} repetition(s), targets in turn in each; wrk `-t2`, {dur} s per run"
      + (f" ({slow_dur} s in scenario 5)" if slow_dur != "0" else "") + ".\n")
print("| scenario | target | req/s | × nginx | p50 | p99 | proxy CPU µs/req | store CPU µs/req | notes |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for label, target in order:
    rs = runs[(label, target)]
    ratios = []
    for r in rs:
        ref = [n for n in runs.get((label, "nginx"), []) if n["rep"] == r["rep"]]
        if ref and ref[0]["rps"] > 0:
            ratios.append(r["rps"] / ref[0]["rps"])
    cpu = med([r["proxy_ticks"] * tick_us / r["requests"] if r["requests"] else None for r in rs])
    rcpu = redis_cpu(target, rs)
    notes = []
    errs = sum(r["status_err"] for r in rs); serrs = sum(r["socket_err"] for r in rs)
    total = sum(r["requests"] for r in rs)
    if label.startswith("5."):
        # The ideal: each connection completes one request a second. In a run of D
        # whole seconds that is D - 1 answers per connection: the D-th would land just
        # after the end, as every answer takes a little more than 1 s.
        secs = int(slow_dur) - 1
        pct = med([100 * r["requests"] / (r["conns"] * secs) for r in rs])
        notes.append(f"{pct:.1f}% of ideal ({rs[0]['conns'] * secs:,} answers in {slow_dur} s)")
        notes.append(f"peak RSS {med([r['rss_kib'] for r in rs]) / 1024:.1f} MiB")
        stored = med([r["stored_kib"] for r in rs])
        if stored:
            notes.append(f"of which {stored / 1024:.1f} MiB the answers it stores "
                         "(idemproxy_memory_store_bytes)")
    if errs:
        notes.append(f"{errs:.0f} non-2xx of {total:.0f}")
    if serrs:
        notes.append(f"{serrs:.0f} socket errors")
    print(f"| {label} | {target} | {num(med([r['rps'] for r in rs]), ',.0f')} | "
          f"{num(med(ratios), '.2f') if target != 'nginx' else '1'} | {ms(med([r['p50_us'] for r in rs]))} | "
          f"{ms(med([r['p99_us'] for r in rs]))} | {num(cpu, '.1f')} | {rcpu} | {'; '.join(notes)} |")

waves = [l.strip().split("|") for l in open(wave) if l.strip()]
if waves:
    print("\n5. One wave of 1000 connections, one POST /slow (1 s) each, new keys, on a fresh "
          "process (nothing stored before): peak RSS (VmHWM) against the idle RSS before it "
          "(nginx: master and workers summed)\n")
    print("| target | idle RSS | peak RSS | 1000 connections cost | answered |")
    print("|---|---:|---:|---:|---|")
    for target, idle, peak, got in waves:
        idle, peak = int(idle), int(peak)
        print(f"| {target} | {idle / 1024:.1f} MiB | {peak / 1024:.1f} MiB | "
              f"{(peak - idle) / 1024:.1f} MiB | {got.replace('answered=', '').replace(' failed=', ', failed ')} |")

mem = [l.strip().split("|") for l in open(memory) if l.strip()]
if mem:
    print("\n6. Memory per stored record (PostgreSQL: disk), after 100,000 stored answers of 1 KiB "
          "(`POST /kib`, new keys):\n")
    print("| store | records stored | measure | delta | bytes/record | idemproxy RSS growth/record | evictions |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for target, records, what, delta, rss, ev in mem:
        n = int(records)
        per = f"{int(delta) / n:,.0f}" if n else "–"
        rper = f"{int(rss) / n:,.0f}" if n else "–"
        print(f"| {target} | {n:,} | {what} | {int(delta):,} | {per} | {rper} | {ev} |")
print("\nCPU µs/req: utime+stime over the run, per request completed, of the proxy process "
      "(nginx: its workers; idemproxy-cluster-x2: both proxies) and of every redis-server behind "
      "it: the one redis-server of idemproxy-redis and -rediss (plain TCP and TLS to the same "
      "one); the 3 masters of the Redis Cluster (no replicas) of idemproxy-cluster and -x2, "
      "their sum and each one's share; and of idemproxy-redis-wait (`--redis-wait-replicas 1`: "
      "a WAIT after each write), its master's and its replica's; of idemproxy-postgres, every "
      "process of the PostgreSQL server (the postmaster and its children: the proxy's "
      "backends, the WAL writer, the checkpointer), summed. "
      "idemproxy-cluster-x2: two proxies on the one cluster, each driven by its own wrk "
      "(`-t1`, half the connections: the same offered load as the other rows); req/s is the "
      "sum of the two, p50 and p99 the larger of the two wrks'. The cluster, WAIT, PostgreSQL, "
      "routes50, sealed and traced targets run scenarios 1 (64 connections) and 2 only; in 2 (one key) "
      "on the cluster the master of that key's slot answers every request. idemproxy-routes50 "
      "is idemproxy-memory with 50 routes, the request matching the last: the difference is "
      "what route matching costs. idemproxy-sealed is idemproxy-memory with "
      "`--store-encryption-key-file`: the difference is what sealing each stored answer (new "
      "keys) and opening it (replays) costs. idemproxy-traced is idemproxy-memory with "
      "`--otlp-endpoint` (every request sampled, its spans taken by the stub): the difference "
      "is what tracing costs, the exporter thread's CPU included. "
      "× nginx: the median of the per-repetition ratios.")
