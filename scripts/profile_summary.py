#!/usr/bin/env python3
"""Sums a Chrome-trace profile (bench_train --profile) by operator: total ms, calls, share.
Usage: scripts/profile_summary.py trace.json [TOP]"""
import collections
import json
import sys

events = json.load(open(sys.argv[1]))
if isinstance(events, dict):
    events = events.get("traceEvents", [])
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
total = collections.Counter()
calls = collections.Counter()
# self time: subtract the time of directly nested events on the same thread
by_thread = collections.defaultdict(list)
for e in events:
    if e.get("ph") == "X" and "dur" in e:
        by_thread[e.get("tid")].append(e)
span = 0.0
for tid, evs in by_thread.items():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    selft = {}
    for i, e in enumerate(evs):
        while stack and evs[stack[-1]]["ts"] + evs[stack[-1]]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            selft[stack[-1]] = selft.get(stack[-1], evs[stack[-1]]["dur"]) - e["dur"]
        stack.append(i)
        selft.setdefault(i, e["dur"])
    for i, e in enumerate(evs):
        total[e["name"]] += selft[i] / 1000.0
        calls[e["name"]] += 1
    if evs:
        span = max(span, (max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)) / 1000.0)
all_ms = sum(total.values())
print(f"wall span {span:.1f} ms, summed self time {all_ms:.1f} ms")
name_width = 72
print(f"{'operator':{name_width}s} {'self ms':>10s} {'calls':>7s} {'share':>7s}")
for name, ms in total.most_common(top):
    short = name.replace("torch::autograd::CppNode<", "backward<").replace("(anonymous namespace)::", "")
    print(f"{short[:name_width]:{name_width}s} {ms:10.1f} {calls[name]:7d} {100 * ms / all_ms:6.1f}%")
