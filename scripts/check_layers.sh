#!/usr/bin/env bash
# Checks the house rules of docs/architecture.md: each floor of src/emoe includes only the floors
# it may, no include cycle between floors, no architecture name compared outside models/ (and
# io/hf_config), no cast to a plug or adapter class outside its own floor. Exit 1 on a breach.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - "$@" <<'EOF'
import os, re, sys

allowed = {
    "core": set(),
    "io": {"core"},
    "tokenizer": {"core"},
    "models": {"core", "io"},
    "moe": {"core", "io", "models"},
    "peft": {"core", "io", "models", "moe"},
    "methods": {"core", "io", "tokenizer", "models", "moe", "peft"},
    "data": {"core", "io", "tokenizer"},
    "eval": {"core", "io", "tokenizer", "models", "data"},
    "dist": {"core"},
    "analysis": {"core", "io", "tokenizer", "models", "moe", "peft", "methods", "data", "eval"},
    "train": {"core", "io", "tokenizer", "models", "moe", "peft", "methods", "data", "eval",
              "dist", "analysis"},
}
root = sys.argv[1] if len(sys.argv) > 1 else "."
problems = []
edges = {}
for dirpath, _, files in os.walk(os.path.join(root, "src/emoe")):
    rel = os.path.relpath(dirpath, os.path.join(root, "src/emoe")).split(os.sep)
    floor = rel[0]
    if floor == ".":
        continue
    if floor not in allowed:
        problems.append(f"src/emoe/{floor}: a floor docs/architecture.md does not list")
        continue
    for name in files:
        path = os.path.join(dirpath, name)
        text = open(path, encoding="utf-8", errors="replace").read()
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r'\s*#include "emoe/(\w+)/', line)
            if m and m.group(1) != floor:
                edges.setdefault(floor, set()).add(m.group(1))
                if m.group(1) not in allowed[floor]:
                    problems.append(f"{os.path.relpath(path, root)}:{n}: {floor}/ includes "
                                    f"{m.group(1)}/ (allowed: {', '.join(sorted(allowed[floor])) or 'nothing'})")

# cycles between floors (the table above has none; this guards the table itself)
def cyclic(node, stack, seen):
    if node in stack:
        return stack[stack.index(node):] + [node]
    if node in seen:
        return None
    seen.add(node)
    for nxt in sorted(edges.get(node, ())):
        c = cyclic(nxt, stack + [node], seen)
        if c:
            return c
    return None
seen = set()
for f in sorted(edges):
    c = cyclic(f, [], seen)
    if c:
        problems.append("include cycle between floors: " + " -> ".join(c))
        break

names = r"bert|gpt2|llama|t5|roberta|qwen2|qwen3|mistral"
plug_or_adapter = r"(RoutedFfnImpl|ExpertFfnImpl|UpcycledFfnImpl|LoraAdapter|Ia3Adapter|MovAdapter|MoloraAdapter)"
own_floor = {"RoutedFfnImpl": "moe", "ExpertFfnImpl": "moe", "UpcycledFfnImpl": "moe",
             "LoraAdapter": "peft", "Ia3Adapter": "peft", "MovAdapter": "peft", "MoloraAdapter": "peft"}
for top in ("src", "apps"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for name in files:
            if not name.endswith((".h", ".cpp")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            text = open(path, encoding="utf-8", errors="replace").read()
            for n, line in enumerate(text.splitlines(), 1):
                if not rel.startswith(("src/emoe/models/", "src/emoe/io/hf_config")) and \
                        re.search(r'(==|!=)\s*"(%s)"' % names, line):
                    problems.append(f"{rel}:{n}: an architecture's name compared outside models/: "
                                    f"ask its traits (models/architecture.h)")
                for m in re.finditer(r"dynamic_cast<\s*(const\s+)?%s\s*\*" % plug_or_adapter, line):
                    floor = rel.split("/")[2] if rel.startswith("src/emoe/") else "apps"
                    if floor != own_floor[m.group(2)]:
                        problems.append(f"{rel}:{n}: cast to {m.group(2)} outside "
                                        f"{own_floor[m.group(2)]}/: use the Routed / FfnPlug / "
                                        f"LinearAdapter interfaces")

for p in problems:
    print("check_layers:", p)
print(f"check_layers: {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
EOF
