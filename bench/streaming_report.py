#!/usr/bin/python3
"""Prints the tables scripts/bench adds after scripts/bench_report.py's:
idemproxy before and after a change (with IDEMPROXY_BENCH_BASELINE), and the
streamed answers of scenarios 7 (server-sent events) and 8 (a 256 MiB
download).

  streaming_report.py RESULTS SSE DL DL_RSS CLK_TCK BASELINE

RESULTS is scripts/bench's raw results (see bench_report.py); the pairs are
TARGET and TARGET-before in the same scenario. SSE has bench/sse.py's lines
(target first_ms total_ms events status). DL has one line per download:
target run http_code size_download speed_download (bytes/s). DL_RSS has
one line per target: target|idle_kib|peak_kib. CLK_TCK: clock ticks
per second, the unit of proxy_ticks. BASELINE is the older
binary's path and version, or empty."""
import math
import statistics
import sys

results, sse, dl, dl_rss, clk, baseline = sys.argv[1:]
CLK = int(clk)


def med(xs):
    return statistics.median(xs) if xs else None


def p90(xs):
    """Nearest rank: the value 90% of the samples are at or under."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)]


def num(x, fmt):
    return "–" if x is None else format(x, fmt)


def ms(us):
    return "–" if us is None else f"{us / 1000:.2f} ms"


def lines(path):
    try:
        return [l.rstrip("\n") for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------- before and after
runs, order = {}, []
for line in lines(results):
    label, target, rep, conns, kv, extra = line.split("\t")
    r = dict(x.split("=") for x in (kv + " " + extra).split())
    r.pop("redis_each", None)
    r = {k: float(v) for k, v in r.items()}
    r["rep"] = int(rep)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    if (label, target) not in runs:
        runs[(label, target)] = []
        order.append((label, target))
    runs[(label, target)].append(r)

pairs = [(label, t[:-len("-before")]) for label, t in order
         if t.endswith("-before") and (label, t[:-len("-before")]) in runs]
if pairs:
    print(f"\nBefore and after: `{baseline}` (before) against the binary above (after), the same "
          "arguments, each right after the other in every repetition. after/before: the median "
          "of the per-repetition ratios of req/s.\n")
    print("| scenario | target | req/s before | req/s after | after/before | p50 before → after "
          "| p99 before → after | proxy CPU µs/req before → after | notes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for label, t in pairs:
        b, a = runs[(label, t + "-before")], runs[(label, t)]
        ratios = [x["rps"] / y["rps"] for x in a for y in b if x["rep"] == y["rep"] and y["rps"] > 0]

        def cpu(rs):
            return med([r["proxy_ticks"] * 1e6 / CLK / r["requests"] for r in rs if r["requests"]])

        notes = []
        for name, rs in (("before", b), ("after", a)):
            errs = sum(r["status_err"] for r in rs)
            serrs = sum(r["socket_err"] for r in rs)
            if errs:
                notes.append(f"{name}: {errs:.0f} non-2xx of {sum(r['requests'] for r in rs):.0f}")
            if serrs:
                notes.append(f"{name}: {serrs:.0f} socket errors")
        print(f"| {label} | {t} | {num(med([r['rps'] for r in b]), ',.0f')} | "
              f"{num(med([r['rps'] for r in a]), ',.0f')} | {num(med(ratios), '.2f')} | "
              f"{ms(med([r['p50_us'] for r in b]))} → {ms(med([r['p50_us'] for r in a]))} | "
              f"{ms(med([r['p99_us'] for r in b]))} → {ms(med([r['p99_us'] for r in a]))} | "
              f"{num(cpu(b), '.1f')} → {num(cpu(a), '.1f')} | {'; '.join(notes)} |")

# ---------------------------------------------------------------- 7. server-sent events
by = {}
for line in lines(sse):
    t, first, total, events, status = line.split()
    by.setdefault(t, []).append((float(first), float(total), int(events), int(status)))
if by:
    print("\n7. Server-sent events: `GET /sse`, the stub's 5 events 200 ms apart (the first at "
          "once, each flushed on its own), one request at a time, the targets in turn, each on "
          "a new connection; from the request's first byte to the first complete event, and "
          "to the stream's end (bench/sse.py). nginx with `proxy_buffering off`. p90: nearest "
          "rank.\n")
    print("| target | requests | first event p50 | first event p90 | whole stream p50 "
          "| whole stream p90 | failed |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for t, rs in by.items():
        ok = [r for r in rs if r[3] == 200 and r[2] == 5 and r[0] >= 0]
        firsts, totals = [r[0] for r in ok], [r[1] for r in ok]
        bad = len(rs) - len(ok)
        why = ""
        if bad:
            why = ", ".join(sorted({f"status {r[3]}, {r[2]} events" for r in rs if r not in ok}))
        print(f"| {t} | {len(rs)} | {num(med(firsts), '.1f')} ms | {num(p90(firsts), '.1f')} ms | "
              f"{num(med(totals), '.1f')} ms | {num(p90(totals), '.1f')} ms | "
              f"{bad}{' (' + why + ')' if why else ''} |")

# ---------------------------------------------------------------- 8. a 256 MiB download
by = {}
for line in lines(dl):
    t, run, code, size, speed = line.split()
    by.setdefault(t, []).append((code, int(float(size)), float(speed)))
rss = {t: (int(i), int(p)) for t, i, p in (l.split("|") for l in lines(dl_rss))}
if by:
    size = 256 << 20
    print("\n8. A 256 MiB download: `GET /dl`, a file the stub serves, one at a time, the "
          "targets in turn (`curl -o /dev/null`); MiB/s from curl's `speed_download`; peak "
          "RSS (VmHWM, reset before the first download) against the idle RSS before it "
          "(nginx: its workers summed). nginx with `proxy_buffering off`.\n")
    print("| target | downloads | MiB/s p50 | MiB/s min–max | idle RSS | peak RSS | growth | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for t, rs in by.items():
        ok = [r for r in rs if r[0] == "200" and r[1] == size]
        speeds = [r[2] / (1 << 20) for r in ok]
        idle, peak = rss.get(t, (0, 0))
        bad = [f"{r[0]}, {r[1]:,} bytes" for r in rs if r not in ok]
        print(f"| {t} | {len(rs)} | {num(med(speeds), ',.0f')} | "
              f"{num(min(speeds) if speeds else None, ',.0f')}–{num(max(speeds) if speeds else None, ',.0f')} | "
              f"{idle / 1024:.1f} MiB | {peak / 1024:.1f} MiB | {(peak - idle) / 1024:.1f} MiB | "
              f"{len(bad)}{' (' + '; '.join(bad) + ')' if bad else ''} |")
