#!/usr/bin/env python3
"""Pools the rounds of every pair written by scripts/bench-ab.sh (DIR/{snapshots,resume}-
{A,B}-N.json) and prints medians side by side with the A/B ratio.
Usage: bench-ab-summary.py DIR [A_LABEL (default encrypted)] [B_LABEL (default plain)]"""
import glob
import json
import statistics
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "target/bench-encryption"
a_label = sys.argv[2] if len(sys.argv) > 2 else "encrypted"
b_label = sys.argv[3] if len(sys.argv) > 3 else "plain"
cols = [("suspend_seconds", "suspend"), ("resume_local_seconds", "local first"),
        ("full_local_seconds", "local all"), ("suspend_durable_seconds", "suspend DURABLE"),
        ("resume_durable_seconds", "durable first"), ("full_durable_seconds", "durable all")]
pooled = {}
for label in (a_label, b_label):
    for f in sorted(glob.glob(f"{d}/snapshots-{label}-*.json")):
        for w in json.load(open(f))["workloads"]:
            key = (w["workload"], w["restore"])
            for c, _ in cols:
                pooled.setdefault((key, c, label), []).extend(w[c])
    for f in sorted(glob.glob(f"{d}/resume-{label}-*.json")):
        for lvl in json.load(open(f))["levels"]:
            pooled.setdefault((("resume burst", f"n={lvl['n']}"), "resume", label), []).extend(
                s["seconds"] for s in lvl["samples"] if s["status"] == 200)
keys = sorted({k for (k, _, _) in pooled})
print(f"| workload | restore | figure | {b_label} | {a_label} | ratio | samples |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for k in keys:
    for c, name in cols + [("resume", "first answer")]:
        p, e = pooled.get((k, c, b_label)), pooled.get((k, c, a_label))
        if not p or not e:
            continue
        mp, me = statistics.median(p), statistics.median(e)
        print(f"| {k[0]} | {k[1]} | {name} | {mp:.3f} s | {me:.3f} s | {me / mp:.2f}× | {len(e)}+{len(p)} |")
