"""The bench's report: Markdown tables that put each figure beside its floor and its
peers as ratios; the targets are checked in ``targets.py``, the plots drawn in
``plots.py``."""

from __future__ import annotations

from typing import Any

from bench import perfdso
from bench.format import MiB, num, pcells, times
from bench.scenarios import branch, egress, environment, scale, session, shells
from bench.targets import describe_flood, describe_session_limit, targets


def markdown(data: dict[str, Any], command: str) -> str:
    m = data["machine"]
    lines = [
        "# toolpool bench",
        "",
        f"Run {data['started']} with `{command}` — {m['cores']} cores ({m['cpu']}), "
        f"{m['memory_bytes'] / 2**30:.0f} GiB, Linux {m['kernel']}, Python {m['python']}, "
        f"libzmq {m['libzmq']}. Medians unless said; every sample is in `raw.json`.",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {measured} | {verdict} |" for name, measured, verdict in targets(data)]

    if over := data.get("overhead"):
        s = over["summary_us"]
        floor = s["floor: raw pyzmq, two hops"]["p50"]
        lines += [
            "",
            "## Overhead: one no-op call at a time",
            "",
            "| path | p50 µs | p90 µs | p99 µs | p50 × floor |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, v in s.items():
            lines.append(
                f"| {name} | {num(v['p50'], 1)} | {num(v['p90'], 1)} | {num(v['p99'], 1)} | "
                f"{times(v['p50'], floor)} |"
            )
        lines += ["", "![latency distributions](latency.png)"]

    if cpu := data.get("cpu"):
        lines += cpu_section(cpu)

    if thr := data.get("throughput"):
        size = max(thr["sizes"])
        kinds = sorted(
            {c["kind"] for c in thr["cells"]},
            key=lambda k: [c["kind"] for c in thr["cells"]].index(k),
        )
        concurrencies = sorted({c["concurrency"] for c in thr["cells"]})
        workers = sorted({c["workers"] for c in thr["cells"]})
        lines += [
            "",
            f"## Throughput against limits (turns of {size} calls; calls/s, ★ the knee: "
            "the lowest max_tool_concurrency within 10% of the best)",
            "",
        ]
        for kind in kinds:
            lines += [
                f"**{kind}**",
                "",
                "| workers | "
                + " | ".join(f"c={c}" for c in concurrencies)
                + " | p99 µs at the knee |",
                "|---|" + "---:|" * (len(concurrencies) + 1),
            ]
            for w in workers:
                cells = {
                    c["concurrency"]: c
                    for c in thr["cells"]
                    if c["kind"] == kind and c["workers"] == w and c["size"] == size
                }
                knee = thr["knees"].get(f"{kind} / {w} workers")
                row = [
                    num(cells[c]["calls_per_second"], 1) + (" ★" if c == knee else "")
                    for c in concurrencies
                ]
                p99 = cells[knee]["latency_us"]["p99"] if knee in cells else float("nan")
                lines.append(f"| {w} | " + " | ".join(row) + f" | {num(p99)} |")
            lines.append("")
        lines += ["![throughput](throughput.png)", "", "![p99](p99.png)"]

    if mixed := data.get("mixed"):
        base = mixed["16 safe calls"]["p50"]
        lines += [
            "",
            "## Mixed turns: one exclusive edit among 16 safe calls (20 ms each), 2 workers, "
            "max_tool_concurrency 8",
            "",
            "| turn | ms | × all safe |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {n} | {num(v['p50'], 1)} | {times(v['p50'], base)} |" for n, v in mixed.items()
        ]

    if ses := data.get("session"):
        lines += session.report(ses)

    if intr := data.get("interrupts"):
        lines += [
            "",
            f"## Interrupts (cancel grace {intr['grace_seconds'] * 1000:.0f} ms)",
            "",
            "| call | what is timed | p50 ms | p99 ms | max ms |",
            "|---|---|---:|---:|---:|",
        ]
        what = {
            "cancel, cooperative": "interrupt → tool_end",
            "cancel, ignores SIGTERM": "interrupt → tool_end",
            "block, ~500 ms left": "interrupt → turn_end",
        }
        for name, v in intr["summary_ms"].items():
            lines.append(f"| {name} | {what[name]} | {pcells(v)} |")

    if rec := data.get("recovery"):
        s = rec["replacement_summary_ms"]
        st = rec["stream"]
        lines += [
            "",
            "## Recovery",
            "",
            f"A crashed worker's replacement was ready {num(s['p50'], 1)} ms (p50) and "
            f"{num(s['p99'], 1)} ms (p99) after the crash ({s['n']} crashes).",
            "",
            "| stream of no-op calls | p50 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|",
            f"| alone | {pcells(st['baseline_ms'], 2)} |",
            f"| with a crash every 300 ms beside it | {pcells(st['with_crashes_ms'], 2)} |",
            "",
            f"{st['errors']} of the stream's {st['with_crashes_ms']['n']} calls failed while "
            f"{len(st['crash_times'])} workers crashed beside it.",
            "",
            "![recovery](recovery.png)",
        ]
        if z := rec.get("zygote"):
            w, r = z["working_summary_ms"], z["recovery_summary_ms"]
            lines += [
                "",
                f"A SIGKILLed zygote ({w['n']} kills): a call worked again {num(w['p50'])} ms "
                f"(median), {num(w['max'])} ms (max) after the kill, on a new zygote's worker "
                f"(the pool's own figure, death noticed → a new worker ready: {num(r['p50'])} "
                f"ms median); {z['calls_lost']} calls submitted meanwhile ended lost.",
            ]

    if soak := data.get("soak"):
        lines += [
            "",
            f"## Soak: {soak['clients']} clients, {soak['seconds']:.0f} s of mixed calls, "
            f"{soak['workers']} workers",
            "",
            f"{soak['calls']:,} calls in {soak['turns']:,} turns: {soak['lost']} lost, "
            f"{soak['duplicated']} duplicated, {soak['unexpected']} with an unexpected "
            f"outcome; {soak['workers_replaced']} workers replaced; {soak['orphans']} of the "
            f"{soak['descendants_seen']} pool processes seen left after the daemon stopped.",
            "",
            "| daemon | start | end | high, 1st half | high, 2nd half | slope /min | "
            "slope /min, 2nd half |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, key, digits in (
            ("RSS MB", "rss_mib", 1),
            ("open fds", "fds", 0),
            ("threads", "threads", 0),
        ):
            v = soak[key]
            lines.append(
                f"| {label} | {num(v['start'], digits)} | {num(v['end'], digits)} | "
                f"{num(v['max_first_half'], digits)} | {num(v['max_second_half'], digits)} | "
                f"{num(v['slope_per_minute'], 2)} | {num(v['slope_per_minute_second_half'], 2)} |"
            )
        lines += ["", "| calls of | outcomes |", "|---|---|"]
        for action, codes in soak["outcomes"].items():
            told = ", ".join(f"{code} {n}" for code, n in sorted(codes.items()))
            lines.append(f"| {action} | {told or '–'} |")
        cycle = soak["session_cycle"]
        lines += [
            "",
            f"Session cycle: {cycle['cycles']:,} opens and closes on one connection in "
            f"{cycle['seconds']:.1f} s; the daemon's RSS {cycle['rss_before_mib']:.1f} → "
            f"{cycle['rss_after_mib']:.1f} MB ({cycle['rss_change_mib']:+.2f} MB), "
            f"{cycle['sessions_after']} sessions in its status after.",
            "",
            "![soak](soak.png)",
        ]
        if b := soak.get("bombs"):
            alone, beside = b["read_alone_ms"], b["read_beside_bombs_ms"]
            lines += [
                "",
                "### Bombs: calls built to explode, another session's reads beside them (L10)",
                "",
                f"The daemon's RSS {b['daemon_rss_before_mib']:.1f} MB before, "
                f"{b['daemon_rss_high_mib']:.1f} MB at its high "
                f"({b['daemon_rss_growth_mib']:+.1f} MB). The other session's read: p50 "
                f"{alone['p50']:.1f} → {beside['p50']:.1f} ms, p99 {alone['p99']:.1f} → "
                f"{beside['p99']:.1f} ms ({b['p99_ratio']:.2f}×; {alone['n']} reads alone, "
                f"{beside['n']} beside).",
                "",
                "| bomb | how it ended | s in its worker |",
                "|---|---|---:|",
            ]
            for bomb in b["bombs"]:
                lines.append(f"| {bomb['bomb']} | {bomb['outcome']} | {bomb['seconds']:.2f} |")

    if fl := data.get("flood"):
        rss = fl["daemon_rss_mib"]
        acct = fl["client_accounting"]
        told = "none in status" if acct is None else ", ".join(f"{k} {v}" for k, v in acct.items())
        lines += [
            "",
            f"## Flood: a client submits {fl['turns']} turns of {fl['calls_per_turn']} reads "
            f"of a {fl['file_bytes'] / 1e6:.0f} MB file and reads nothing for "
            f"{fl['pause_seconds']:g} s",
            "",
            f"client_stall_seconds {fl['client_stall_seconds']:g}"
            f"{'' if fl['daemon_knows_client_stall_seconds'] else ' (unknown to this daemon)'}; "
            f"the turn output budget {fl['turn_output_budget']}.",
            "",
            "| daemon RSS MB | before | peak during the flood | after |",
            "|---|---:|---:|---:|",
            f"| | {num(rss['before'], 1)} | {num(rss['peak_during_flood'], 1)} | "
            f"{num(rss['end'], 1)} |",
            "",
            "| another client's no-op calls | n | calls/s | p50 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        rates = fl["steady_calls_per_second"]
        for label, key, rate in (
            ("alone, before the flood", "alone_ms", rates["alone"]),
            (
                "during the flood (submit → the client let go)",
                "during_flood_ms",
                rates["during_flood"],
            ),
            ("after the flooding client was let go", "after_let_go_ms", rates["after_let_go"]),
        ):
            v = fl[key]
            if v["n"]:
                lines.append(f"| {label} | {v['n']} | {num(rate, 1)} | {pcells(v, 2)} |")
        lines += [
            "",
            f"The flooding client: {describe_flood(fl)}.",
        ]
        for i, turn in enumerate(fl["flood_turns"]):
            if turn["ended"]:
                codes = ", ".join(f"{c} {n}" for c, n in sorted(turn["codes"].items()))
                lines.append(f"- turn {i + 1}: ended, {codes}")
            else:
                lines.append(f"- turn {i + 1}: {turn['error']} ({turn['events']} events read)")
        lines += [
            "",
            f"The daemon's accounting for it (its last entry in status): {told}.",
            "",
        ]
        if lim := fl.get("session_limit"):
            lines += [
                f"Sessions of one client (L6): {describe_session_limit(lim)}.",
                "",
            ]
        lines += [
            "![flood](flood.png)",
        ]

    if sh := data.get("shells"):
        lines += shells.report(sh)

    if conf := data.get("confinement"):
        base = conf["summary_ms"]["none"]["p50"]
        lines += [
            "",
            "## Confinement",
            "",
            "One bash call of `true` through the bash tool in-process, under each sandbox "
            "profile (calls interleaved). The full profile adds "
            f"{conf['added_ms']:.1f} ms per call at the median; with network allowed "
            f"(an outbound-only namespace connected by pasta) "
            f"{conf.get('added_network_ms', float('nan')):.1f} ms.",
            "",
            "| profile | p50 ms | p99 ms | max ms | p50 added ms |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, v in conf["summary_ms"].items():
            lines.append(f"| {name} | {pcells(v, 2)} | {v['p50'] - base:.2f} |")
        if through := conf.get("through_daemon"):
            lines += [
                "",
                "Through the daemon, one session each: bash `true`, `ls` and a fork-exec of "
                "`true` in the bench's process, interleaved (medians); the sandbox adds "
                "bash − ls − fork-exec (V1's target: ≤ 2 ms in the session's sandbox).",
                "",
                "| commands start in | bash true ms | ls ms | fork-exec ms | added ms |",
                "|---|---:|---:|---:|---:|",
            ]
            for kind, row in through.items():
                m = row["median_ms"]
                lines.append(
                    f"| {kind} | {m['bash true']:.2f} | {m['ls']:.2f} | "
                    f"{m['fork-exec true']:.2f} | {row['added_ms']:.2f} |"
                )

    if env := data.get("environment"):
        lines += environment.report(env)

    if out := data.get("egress"):
        lines += egress.report(out)

    if branched := data.get("branch"):
        lines += branch.report(branched)

    if sc := data.get("scale"):
        lines += scale.report(sc)

    if peers := data.get("peers"):
        t = peers["throughput_calls_per_second"]
        kinds = list(t["toolpool"])
        lines += [
            "",
            f"## Peers: the same functions, {peers['workers']} worker processes each",
            "",
            "| runner | " + " | ".join(f"{k} calls/s" for k in kinds) + " | one no-op p50 µs |",
            "|---|" + "---:|" * (len(kinds) + 1),
        ]
        for name, rates in t.items():
            lat = peers["latency_us"].get(name, {}).get("p50", float("nan"))
            lines.append(
                f"| {name} | "
                + " | ".join(
                    f"{num(rates[k], 0)} ({times(t['toolpool'][k], rates[k])})" for k in kinds
                )
                + f" | {num(lat, 1)} |"
            )
        lines.append("")
        lines.append("In parentheses: toolpool's rate as a multiple of that runner's.")
        if peers["ray"]:
            lines += ["", f"Ray: {peers['ray']}."]
        g = peers["grep"]
        lines += [
            "",
            f"**grep** `{g['pattern']}` over `{g['tree']}`: "
            f"raw rg {num(g['raw_rg_ms']['p50'], 1)} ms, "
            f"through toolpool {num(g['toolpool_ms']['p50'], 1)} ms "
            f"({times(g['toolpool_ms']['p50'], g['raw_rg_ms']['p50'])}) with the default "
            "CPU quota of one CPU per worker, "
            f"{num(g['toolpool_all_cores_ms']['p50'], 1)} ms "
            f"({times(g['toolpool_all_cores_ms']['p50'], g['raw_rg_ms']['p50'])}) with "
            f"`worker_cpus = {g['cores']}`, the cores raw rg uses.",
        ]
    if over := data.get("overhead"):
        mem = over["idle_memory"]
        lines += [
            "",
            "## Memory at idle",
            "",
            "| process | RSS MB | unique MB |",
            "|---|---:|---:|",
            f"| daemon | {mem['daemon']['rss'] / MiB:.1f} | {mem['daemon']['uss'] / MiB:.1f} |",
        ]
        if mem.get("zygote"):
            lines.append(f"| zygote | {mem['zygote']['rss'] / MiB:.1f} | – |")
        for i, w in enumerate(mem["workers"]):
            lines.append(f"| worker {i + 1} | {w['rss'] / MiB:.1f} | {w['uss'] / MiB:.1f} |")
    return "\n".join(lines) + "\n"


_THREADS = (("total", "all threads"), ("main", "main thread"), ("zmq", "ZeroMQ I/O threads"),
            ("other", "other threads"))  # fmt: skip


def cpu_section(cpu: dict[str, Any]) -> list[str]:
    """CPU per call of each process, the in-process pipeline, the daemon's profile."""
    one, batch = cpu["one_call"], cpu["batch"]
    a, b = one["median"], batch["median"]
    only = cpu.get("one_call_results")  # absent from runs before it was measured
    r = only["median"] if only else None
    lines = [
        "",
        f"## CPU per call: no-op calls, {cpu['workers']} workers, one blocking client",
        "",
        f"µs of CPU (user + system) per call; medians of {cpu['repeats']} repetitions of "
        f"{one['turns']:,} one-call turns and of {batch['turns']:,} turns of "
        f"{batch['size']} calls, from the kernel's run times of each process and thread.",
        "",
        f"| process | one-call turns | {batch['size']}-call turns |"
        + (" one-call turns, results only |" if r else ""),
        "|---|---:|---:|" + ("---:|" if r else ""),
    ]
    for who in ("daemon", "client"):
        for key, label in _THREADS:
            extra = f" {num(r[who][key])} |" if r else ""
            lines.append(f"| {who}, {label} | {num(a[who][key])} | {num(b[who][key])} |{extra}")
    loads = [a, b, *([r] if r else [])]

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(cell(m) for m in loads) + " |"

    lines += [
        row(
            "daemon, user / system (10 ms ticks)",
            lambda m: f"{num(m['daemon']['user'])} / {num(m['daemon']['system'])}",
        ),
        row(
            f"workers ({a['workers']['count']}), all threads", lambda m: num(m["workers"]["total"])
        ),
        row("zygote", lambda m: num(m["zygote"]["total"])),
        row("wall time per call", lambda m: num(m["wall"])),
    ]
    runs = one["runs"] + batch["runs"] + (only["runs"] if only else [])
    replaced = sum(run["workers"]["ended"] + run["workers"]["started"] for run in runs)
    if replaced:
        lines += ["", f"{replaced} workers ended or started during the measurement."]
    lines += [
        "",
        "| in-process one-call turn (Coordinator, InProcessExecutor) | p50 µs | p99 µs | "
        "CPU µs per turn |",
        "|---|---:|---:|---:|",
    ]
    for tool, how in (
        ("bench_noop", "sync no-op, in a thread"),
        ("bench_anoop", "async no-op, a task"),
    ):
        p = cpu["in_process"][tool]
        lines.append(
            f"| {tool} ({how}) | {num(p['wall_us']['p50'], 1)} | {num(p['wall_us']['p99'], 1)} | "
            f"{num(p['cpu_us']['total'], 1)} |"
        )
    lines += profile_section(cpu["profile"])
    return lines + libraries_section(cpu.get("libraries"), cpu["batch"]["size"])


def profile_section(prof: dict[str, Any], shown: int = 15) -> list[str]:
    lines = ["", "## Daemon profile: py-spy under one-call no-op turns", ""]
    if "error" in prof:
        return [*lines, f"No profile: {prof['error']}."]
    lines += [
        f"{prof['samples']:,} samples in {prof['seconds']} s at {prof['rate']} Hz while "
        f"{prof['loads']:,} turns ran ({prof['load_seconds']} s); a thread of the daemon held "
        f"the GIL at ≈{100 * prof['gil_held_share']:.0f}% of the sampling instants (only those "
        "are sampled: `--gil`). Percent of all samples. Time in C code (the event loop's own, "
        "when it is uvloop's; ZeroMQ's, msgpack's) counts for the Python function that called "
        "it; the inclusive list shows a chain of functions that only call the next once as "
        "its last link.",
        "",
        "| self % | function | inclusive % | function |",
        "|---:|---|---:|---|",
    ]
    own, inclusive = prof["self"][:shown], prof["inclusive"][:shown]
    for i in range(max(len(own), len(inclusive))):
        left = f"{own[i]['percent']:.1f} | `{own[i]['function']}`" if i < len(own) else " | "
        right = (
            f"{inclusive[i]['percent']:.1f} | `{inclusive[i]['function']}`"
            if i < len(inclusive)
            else " | "
        )
        lines.append(f"| {left} | {right} |")
    return lines


def libraries_section(libraries: dict[str, Any] | None, size: int) -> list[str]:
    """The daemon's CPU by shared object (perf), one-call and batched turns side by side."""
    if libraries is None:  # a run from before it was measured
        return []
    lines = ["", "## Daemon CPU by library: perf under no-op turns", ""]
    one, batch = libraries["one_call"], libraries["batch"]
    for label, prof in (("one-call turns", one), (f"{size}-call turns", batch)):
        if "error" in prof:
            return [*lines, f"No samples of {label}: {prof['error']}."]
    lines += [
        f"`perf record -F {one['rate']}` on the daemon for {one['seconds']} s of each load "
        f"({one['samples']:,} and {batch['samples']:,} samples): percent of the daemon's "
        "samples by the shared object they fell in. The event loop's own machinery is "
        "uvloop's loop and asyncio's C tasks; toolpool's Python runs in the interpreter.",
        "",
        f"| library | one-call turns % | {size}-call turns % | what it is |",
        "|---|---:|---:|---|",
    ]
    batched = {row["library"]: row["percent"] for row in batch["by_library"]}
    names = [row["library"] for row in one["by_library"]]
    names += [name for name in batched if name not in names]
    shares = {row["library"]: row["percent"] for row in one["by_library"]}
    for name in names:
        a, b = shares.get(name), batched.get(name)
        cells = [f"{v:.1f}" if v is not None else "–" for v in (a, b)]
        lines.append(f"| `{name}` | {cells[0]} | {cells[1]} | {perfdso.role(name)} |")
    threads = ", ".join(f"{row['thread']} {row['percent']:.0f}%" for row in one["by_thread"])
    return [*lines, "", f"By thread, one-call turns: {threads}."]
