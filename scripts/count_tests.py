#!/usr/bin/python3
"""Counts test results for scripts/test; prints "PASSED FAILED".

  count_tests.py meson DIR/meson-logs/testlog.json
      The C suites, case by case: a test binary built on test/check.h prints
      "ok   <case>" or "FAIL <case>" for each case it runs, and each counts.
      A binary that printed no case line (or crashed before its first) counts
      as one, by its result; one that failed without a FAIL line (a crash, a
      sanitizer report, a leak at exit) adds one failure to its cases.
  count_tests.py junit FILE.xml
      The integration suite from pytest's JUnit report; skips count as failures.

A missing or unreadable report counts as one failure.
"""
import json
import re
import sys
import xml.etree.ElementTree as ET

CASE = re.compile(r"^(ok  |FAIL) (\S+)$", re.M)


def count_meson(path):
    passed = failed = 0
    for line in open(path, encoding="utf-8", errors="replace"):
        if not line.strip():
            continue
        entry = json.loads(line)
        ok = entry["result"] == "OK"
        output = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
        cases = CASE.findall(output)
        if not cases:
            passed, failed = passed + ok, failed + (not ok)
            continue
        good = sum(1 for verdict, _ in cases if verdict == "ok  ")
        bad = len(cases) - good
        if not ok and bad == 0:
            bad = 1  # failed outside any case: a crash, a sanitizer report, a leak
        passed, failed = passed + good, failed + bad
    return passed, failed


def count_junit(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get(k, 0)) for s in suites for k in ("failures", "errors", "skipped"))
    return total - bad, bad if total else max(bad, 1)


def main():
    kind, path = sys.argv[1], sys.argv[2]
    try:
        passed, failed = (count_meson if kind == "meson" else count_junit)(path)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        print("count_tests.py: %s: %s" % (path, e), file=sys.stderr)
        passed, failed = 0, 1
    print(passed, failed)


if __name__ == "__main__":
    main()
