#!/usr/bin/env python3
"""Mutation fuzzing of hopctl's command line (see script/fuzz).

usage: fuzz-hopctl.py HOPCTL SECONDS FINDINGS_FILE

Runs HOPCTL with mutated command lines against a database where the start-up flow is parked
at onboarding. Every run must end with exit status 0, 1 or 64, write a message when it fails,
and never die from a signal; the database must pass PRAGMA integrity_check at the end.
"""
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time

hopctl, seconds, findings = sys.argv[1], float(sys.argv[2]), sys.argv[3]
random.seed(int(os.environ.get("HOP_FUZZ_SEED", time.time())))

seeds = [
    ["status"], ["status", "--flow", "startup", "--subject", "default", "--json"],
    ["history", "--flow", "startup", "--limit", "5"], ["history", "--flow", "startup", "--run", "1", "--json"],
    ["unhop", "--flow", "startup", "--step", "onboarding", "--output", '{"accepted": true}'], ["unhop", "--flow", "startup", "--step", "onboarding", "--output", "[1, 2, {}]"],
    ["cancel", "--flow", "startup"], ["restart", "--flow", "startup"], ["reset-first-use", "onboarding"],
    ["reset-first-use", "--all"], ["first-use", "list", "--json"], ["session", "login", "alice", "--expires-in", "30d"],
    ["session", "logout"], ["session", "show", "--json"], ["graph", "--flow", "startup", "--format", "dot"], ["migrate"],
    ["status", "--busy-timeout", "10"], ["cancel", "--flow", "startup", "--busy-timeout", "10"],
    ["unhop", "--flow", "startup", "--step", "login"], ["unhop", "--flow", "startup", "--step", "main", "--subject", "kiosk"],
    ["--version"], ["statuss"], ["session", "login", "alice", "not-a-token-argument"], ["session", "login", "bob", "--token-stdin"],
    ["session", "login", "bob", "--expires-in", "0.4s"], ["graph", "--flow", "startup", "--json", "--format", "dot"],
    ["history", "--flow", "startup", "--json", "--limit", "-1"], ["reset-first-use", "nosuchfeature"],
]
pieces = [
    "--flow", "--subject", "--output", "--json", "--limit", "--run", "--all", "--expires-in", "--format", "--busy-timeout",
    "--reveal-token", "--token-stdin", "--help", "-h", "--", "-", "startup", "default", "login", "main", "0", "-1",
    "99999999999999999999", "1e309", "NaN", "30d", "0s", "-5m", "mermaid", "dot", "'; DROP TABLE runs; --", "\"", "{", "}",
    "[", "]", "null", "true", '{"a":', '{"a":1}', '"\\ud800"', "\u202e", "\x1b[2J", "\x00", "\xff".encode("latin-1").decode("latin-1"),
    "x" * 300, "x" * 70000, "名前", "👩‍💻", "--step", "--version", "onboarding", "0.4s", "-5d", "1s", "\u200b", "\u2028",
    "statuss", "session", "show", ":memory:", "file:x.sqlite", "/dev/null",
]

def mutate(args):
    args = list(args)
    for _ in range(random.randint(1, 4)):
        choice = random.random()
        if choice < 0.3 and args:
            args[random.randrange(len(args))] = random.choice(pieces)
        elif choice < 0.55:
            args.insert(random.randint(0, len(args)), random.choice(pieces))
        elif choice < 0.7 and args:
            del args[random.randrange(len(args))]
        elif choice < 0.85 and args:
            i = random.randrange(len(args))
            raw = bytearray(args[i].encode("utf-8", "surrogateescape"))
            for _ in range(random.randint(1, 3)):
                if raw:
                    raw[random.randrange(len(raw))] = random.randrange(1, 256)
                else:
                    raw.append(random.randrange(1, 256))
            args[i] = raw.decode("utf-8", "surrogateescape")
        else:
            args = args + random.choice(seeds)
    return [a.replace("\x00", "") for a in args]  # argv cannot hold NUL

with tempfile.TemporaryDirectory() as folder:
    db = os.path.join(folder, "hop.sqlite")
    subprocess.run([hopctl, "migrate", "--db", db], check=True, capture_output=True)
    runs = 0
    failures = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        args = mutate(random.choice(seeds))
        command = [hopctl] + [a.encode("utf-8", "surrogateescape") for a in args] + [b"--db", db.encode()]
        try:
            result = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
        except subprocess.TimeoutExpired:
            failures.append(("timeout", args))
            continue
        runs += 1
        if result.returncode < 0 or result.returncode not in (0, 1, 64) or (result.returncode != 0 and not result.stderr):
            failures.append((result.returncode, args, result.stderr[-500:]))
    check = sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0]
    print(f"hopctl: {runs} command lines, {len(failures)} failures, integrity_check {check}")
    if failures or check != "ok":
        with open(findings, "a") as out:
            for failure in failures:
                out.write(repr(failure) + "\n")
        print(f"findings written to {findings}")
        sys.exit(1)
