#!/usr/bin/env python3
"""Per-test-case summary of one tools/test run.

Reads the Build Event Protocol JSON files Bazel wrote in DIR (one per `bazel test`), follows each
test result to its JUnit XML, prints one line per test case, and ends with
"N passed, N failed, N skipped". A target that failed without a readable XML (crash, timeout,
build failure) counts as one failed case; a `bazel test` that exited with neither 0 nor 3 (tests
failed) nor 4 (no tests to run) counts as a failure too.

Usage: test_summary.py DIR NAME=EXIT_CODE...
"""
import json
import os
import sys
import xml.etree.ElementTree as ET
from urllib.parse import unquote, urlparse


def results_from_bep(path):
    """Yields (label, status, xml_path or None) for each test result in a BEP JSON file.

    Only the last attempt of each (label, run, shard) counts: a flaky test that passed on retry
    passed. A truncated file (Bazel interrupted) yields one failed pseudo-result.
    """
    last = {}
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                last[("(build event file truncated: %s)" % path, 0, 0)] = (0, "INCOMPLETE", None)
                break
            result_id = event.get("id", {}).get("testResult")
            if not result_id:
                continue
            result = event.get("testResult", {})
            xml = None
            for out in result.get("testActionOutput", []):
                if out.get("name") == "test.xml":
                    xml = unquote(urlparse(out.get("uri", "")).path)
            key = (result_id["label"], result_id.get("run", 0), result_id.get("shard", 0))
            attempt = result_id.get("attempt", 0)
            if key not in last or attempt >= last[key][0]:
                last[key] = (attempt, result.get("status", "NO_STATUS"), xml)
    for (label, _, _), (_, status, xml) in last.items():
        yield label, status, xml


def cases_from_xml(path):
    """Yields (name, outcome, seconds, detail) with outcome in pass/fail/skip."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        seconds = float(case.get("time") or 0)
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            yield case.get("name"), "fail", seconds, (failure.text or failure.get("message") or "")
        elif skipped is not None:
            yield case.get("name"), "skip", seconds, skipped.get("message", "")
        else:
            yield case.get("name"), "pass", seconds, ""


def main():
    out_dir, statuses = sys.argv[1], sys.argv[2:]
    counts = {"pass": 0, "fail": 0, "skip": 0}
    lines = []
    # The consumer workspace's labels are its own (//app:...): prefix them with its directory.
    # Runs under a sanitizer (tools/test --asan) are told apart by a "[asan] " prefix.
    for name, prefix in (("host.json", ""), ("consumer.json", "tests/consumer"), ("rdma.json", ""),
                         ("consumer-rdma.json", "tests/consumer"),
                         ("asan-host.json", "[asan] "), ("asan-rdma.json", "[asan] "),
                         ("two-hosts.json", "")):
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            continue
        for label, status, xml in results_from_bep(path):
            label = prefix + label
            cases = []
            if xml and os.path.exists(xml):
                try:
                    cases = list(cases_from_xml(xml))
                except ET.ParseError as e:
                    cases = [("(unreadable test.xml: %s)" % e, "fail", 0, "")]
            if status != "PASSED" and not any(c[1] == "fail" for c in cases):
                cases.append(("(target %s)" % status, "fail", 0, ""))
            if not cases:
                cases = [("(no test cases reported)", "fail", 0, "")]
            for case, outcome, seconds, detail in cases:
                counts[outcome] += 1
                tag = {"pass": "PASSED ", "fail": "FAILED ", "skip": "SKIPPED"}[outcome]
                lines.append("%s %s: %s (%.3f s)" % (tag, label, case, seconds))
                if outcome != "pass" and detail.strip():
                    lines.extend("          " + d for d in detail.strip().splitlines()[:8])
    # tools/fuzz prints one verdict line per target, "FUZZ PASS name" or "FUZZ FAIL name", and
    # tools/check one per check, "CHECK PASS name" or "CHECK FAIL name".
    verdict_failed = {}
    for log, word, name in (("fuzz.log", "FUZZ", "fuzz"), ("checks.log", "CHECK", "checks"),
                            ("installed.log", "INSTALLED", "installed")):
        path = os.path.join(out_dir, log)
        verdict_failed[name] = 0
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                words = line.split()
                if len(words) == 3 and words[0] == word and words[1] in ("PASS", "FAIL", "SKIP"):
                    outcome = {"PASS": "pass", "FAIL": "fail", "SKIP": "skip"}[words[1]]
                    counts[outcome] += 1
                    verdict_failed[name] += outcome == "fail"
                    tag = {"pass": "PASSED ", "fail": "FAILED ", "skip": "SKIPPED"}[outcome]
                    lines.append("%s %s: %s" % (tag, name, words[2]))
    for status in statuses:
        name, _, code = status.partition("=")
        name = "installed" if name == "installed-rdma" else name
        if name in verdict_failed:
            if code != "0" and not verdict_failed[name]:  # it failed before any verdict
                counts["fail"] += 1
                lines.append("FAILED  %s did not complete: %s" % (
                    {"fuzz": "tools/fuzz", "checks": "tools/check",
                     "installed": "tests/installed/run.sh"}[name], code))
            continue
        if code not in ("0", "3", "4"):
            counts["fail"] += 1
            lines.append("FAILED  bazel test (%s) did not complete: %s" % (name, code))
    print("\n".join(lines))
    print("%d passed, %d failed, %d skipped" % (counts["pass"], counts["fail"], counts["skip"]))
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
