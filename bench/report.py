"""The bench's report: Markdown tables that put each figure beside its floor and its
peers as ratios, the targets checked, and PNG plots (matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def _f(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _row(v: dict[str, float], digits: int = 1) -> str:
    """p50 | p99 | max cells."""
    return " | ".join(_f(v[k], digits) for k in ("p50", "p99", "max"))


def _ratio(value: float, base: float) -> str:
    if not base or math.isnan(base) or math.isnan(value):
        return "–"
    return f"{value / base:.2f}×"


def _le(value: float | None, bound: float) -> bool:
    """value ≤ bound, and a value that is missing or nan is not."""
    return value is not None and not math.isnan(value) and value <= bound


def _flood_outcome(fl: dict[str, Any]) -> str:
    """How the flooding client's turns ended, in a few words."""
    if fl["flood_client_disconnected"]:
        after = fl.get("disconnected_after_seconds")
        said = f"disconnected{'' if after is None else f' {after:.1f} s after the flood began'}"
    else:
        said = "not disconnected"
    ended = sum(t["ended"] for t in fl["flood_turns"])
    logged = "the log says so" if fl["log_lines"] else "nothing in the log"
    return (
        f"{said}; {ended} of {len(fl['flood_turns'])} turns ended with results; "
        f"aborted: {fl['flood_turns_aborted_evidence'] or 'no'}; {logged}"
    )


def _session_limit(limit: dict[str, Any]) -> str:
    refused = limit["refused"] or f"none of {limit['attempts']} refused"
    if limit["refused"]:
        refused = f"refused: {refused}"
    return f"{limit['opened']} opened, then {refused}; {limit['sessions_after']} left after"


def targets(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for every target the data can answer."""
    rows: list[tuple[str, str, str]] = []

    def check(name: str, measured: str, ok: bool | None) -> None:
        rows.append((name, measured, "n/a" if ok is None else ("met" if ok else "missed")))

    over = data.get("overhead")
    if over:
        s = over["summary_us"]
        ratio = (
            s["toolpool: client → daemon → worker"]["p50"] / s["floor: raw pyzmq, two hops"]["p50"]
        )
        check("no-op call p50 ≤ 3× the raw two-hop pyzmq round trip", f"{ratio:.2f}×", ratio <= 3)
        mem = over["idle_memory"]
        rss = mem["daemon"]["rss"] / MiB
        check(
            "daemon idle memory ≤ 60 MB",
            f"{rss:.1f} MB RSS ({mem['daemon']['uss'] / MiB:.1f} MB unique)",
            rss <= 60,
        )
        workers = mem["workers"]
        if workers:
            worst = max(w["rss"] for w in workers) / MiB
            unique = max(w["uss"] for w in workers) / MiB
            check(
                "each worker ≤ 35 MB",
                f"{worst:.1f} MB RSS ({unique:.1f} MB unique, the rest shared with the zygote)",
                worst <= 35,
            )
    peers = data.get("peers")
    if peers:
        t = peers["throughput_calls_per_second"]
        ratio = t["toolpool"]["no-op"] / t["ProcessPoolExecutor"]["no-op"]
        check("no-op calls/s, 2 workers ≥ 1.5× ProcessPoolExecutor", f"{ratio:.2f}×", ratio >= 1.5)
        if "Ray tasks" in t:
            ray = t["toolpool"]["no-op"] / t["Ray tasks"]["no-op"]
            check("no-op calls/s ≥ 5× Ray tasks", f"{ray:.2f}×", ray >= 5)
        else:
            check("no-op calls/s ≥ 5× Ray tasks", peers["ray"] or "Ray not measured", None)
        g = peers["grep"]
        ratio = g["toolpool_ms"]["p50"] / g["raw_rg_ms"]["p50"]
        check(
            "grep through toolpool ≤ 1.3× raw rg (default: 1 CPU per worker)",
            f"{ratio:.2f}×",
            ratio <= 1.3,
        )
        ratio = g["toolpool_all_cores_ms"]["p50"] / g["raw_rg_ms"]["p50"]
        check(
            f"grep through toolpool ≤ 1.3× raw rg (worker_cpus = {g['cores']}, as rg)",
            f"{ratio:.2f}×",
            ratio <= 1.3,
        )
    thr = data.get("throughput")
    if thr:
        cells = [
            c
            for c in thr["cells"]
            if c["kind"] == "cpu 20 ms" and c["workers"] == 2 and c["size"] == 8
        ]
        by_c = {c["concurrency"]: c["calls_per_second"] for c in cells}
        widest = max(by_c, default=1)
        if 1 in by_c and widest > 1:
            speedup = by_c[widest] / by_c[1]
            check(
                "8 CPU-bound calls in one turn ≥ 1.8× faster than serial",
                f"{speedup:.2f}× (2 workers, max_tool_concurrency {widest} vs 1)",
                speedup >= 1.8,
            )
    intr = data.get("interrupts")
    if intr:
        s = intr["summary_ms"]
        coop = s["cancel, cooperative"]["p99"]
        check(
            "cancel of a cooperative call → tool_end ≤ 20 ms at p99", f"{coop:.1f} ms", coop <= 20
        )
        grace = intr["grace_seconds"] * 1000
        stubborn = s["cancel, ignores SIGTERM"]["p99"]
        check(
            "cancel of a TERM-ignoring call → tool_end ≤ grace + 20 ms at p99",
            f"{stubborn:.1f} ms (grace {grace:.0f} ms)",
            stubborn <= grace + 20,
        )
    rec = data.get("recovery")
    if rec:
        s = rec["replacement_summary_ms"]
        check(
            "a crashed worker replaced and ready ≤ 50 ms",
            f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms",
            s["p99"] <= 50,
        )
        if z := rec.get("zygote"):
            w = z["working_summary_ms"]
            check(
                "a killed zygote replaced, the pool working again ≤ 1 s (L1)",
                f"median {w['p50']:.0f} ms, max {w['max']:.0f} ms",
                _le(w["max"], 1000),
            )
    if soak := data.get("soak"):
        check(
            "soak: no result lost or duplicated (L8)",
            f"{soak['calls']:,} calls in {soak['turns']:,} turns, {soak['clients']} clients: "
            f"{soak['lost']} lost, {soak['duplicated']} duplicated",
            soak["lost"] == 0 and soak["duplicated"] == 0,
        )
        check(
            "soak: every call ends as its kind makes it (crash: worker_lost, stopped: "
            "cancelled/interrupted, else ok); no client error",
            f"{soak['unexpected']} unexpected, {len(soak['client_errors'])} client errors",
            soak["unexpected"] == 0 and not soak["client_errors"],
        )
        check(
            "soak: no process of the pool outlives the daemon",
            f"{soak['orphans']} left of {soak['descendants_seen']} seen",
            soak["orphans"] == 0,
        )
        rss = soak["rss_mib"]
        long_enough = soak["seconds"] >= 60  # half a quick run is too short for a slope
        check(
            "soak: daemon RSS flat, slope ≤ 1 MB/min after warm-up (second half)",
            f"{_f(rss['slope_per_minute_second_half'], 2)} MB/min "
            f"({_f(rss['start'], 1)} → {_f(rss['end'], 1)} MB over {soak['seconds']:.0f} s"
            + ("" if long_enough else "; too short to judge a slope")
            + ")",
            _le(rss["slope_per_minute_second_half"], 1.0) if long_enough else None,
        )
        fds, threads = soak["fds"], soak["threads"]
        check(
            "soak: open fds and threads flat: no new high in the second half "
            "(fds within 4 of the first half's)",
            f"fds {_f(fds['max_first_half'])} → {_f(fds['max_second_half'])}, "
            f"threads {_f(threads['max_first_half'])} → {_f(threads['max_second_half'])}",
            _le(fds["max_second_half"], (fds["max_first_half"] or 0) + 4)
            and _le(threads["max_second_half"], threads["max_first_half"] or 0),
        )
        cycle = soak["session_cycle"]
        check(
            f"session cycle: {cycle['cycles']:,} opens and closes change the daemon's RSS "
            "≤ 5 MB, and leave no session",
            f"{cycle['rss_change_mib']:+.2f} MB, {cycle['sessions_after']} sessions left",
            abs(cycle["rss_change_mib"]) <= 5 and cycle["sessions_after"] == 0,
        )
    if fl := data.get("flood"):
        peak = fl["daemon_rss_mib"]["peak_during_flood"]
        check(
            "flood: daemon peak RSS < 200 MB while a client reads nothing",
            f"{_f(peak, 1)} MB ({fl['turns']} × {fl['calls_per_turn']} reads of "
            f"{fl['file_bytes'] / 1e6:.0f} MB)",
            not math.isnan(peak) and peak < 200,
        )
        alone, during = fl["alone_ms"]["p99"], fl["during_flood_ms"]["p99"]
        check(
            "flood: another client's p99 within 2× its p99 alone",
            f"{_f(during, 1)} ms vs {_f(alone, 1)} ms ({_ratio(during, alone)})",
            _le(during, 2 * alone),
        )
        limit = fl.get("session_limit")
        if limit:
            check(
                "sessions per client bounded: an open over the limit is refused, naming it (L6)",
                _session_limit(limit),
                limit["refused"] is not None
                and "max_sessions" in limit["refused"]
                and limit["sessions_after"] == 0,
            )
        check(
            f"flood: the stalled client's turns aborted and the client disconnected "
            f"(client_stall_seconds {fl['client_stall_seconds']:g})",
            _flood_outcome(fl),
            fl["flood_turns_aborted"] and fl["flood_client_disconnected"],
        )
    conf = data.get("confinement")
    if conf:
        check(
            "the confinement adds ≤ 10 ms per bash call (p50)",
            f"{conf['added_ms']:.1f} ms",
            conf["added_ms"] <= 10,
        )
    return rows


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
                f"| {name} | {_f(v['p50'], 1)} | {_f(v['p90'], 1)} | {_f(v['p99'], 1)} | "
                f"{_ratio(v['p50'], floor)} |"
            )
        lines += ["", "![latency distributions](latency.png)"]

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
                    _f(cells[c]["calls_per_second"], 1) + (" ★" if c == knee else "")
                    for c in concurrencies
                ]
                p99 = cells[knee]["latency_us"]["p99"] if knee in cells else float("nan")
                lines.append(f"| {w} | " + " | ".join(row) + f" | {_f(p99)} |")
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
            f"| {n} | {_f(v['p50'], 1)} | {_ratio(v['p50'], base)} |" for n, v in mixed.items()
        ]

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
            lines.append(f"| {name} | {what[name]} | {_row(v)} |")

    if rec := data.get("recovery"):
        s = rec["replacement_summary_ms"]
        st = rec["stream"]
        lines += [
            "",
            "## Recovery",
            "",
            f"A crashed worker's replacement was ready {_f(s['p50'], 1)} ms (p50) and "
            f"{_f(s['p99'], 1)} ms (p99) after the crash ({s['n']} crashes).",
            "",
            "| stream of no-op calls | p50 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|",
            f"| alone | {_row(st['baseline_ms'], 2)} |",
            f"| with a crash every 300 ms beside it | {_row(st['with_crashes_ms'], 2)} |",
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
                f"A SIGKILLed zygote ({w['n']} kills): a call worked again {_f(w['p50'])} ms "
                f"(median), {_f(w['max'])} ms (max) after the kill, on a new zygote's worker "
                f"(the pool's own figure, death noticed → a new worker ready: {_f(r['p50'])} "
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
                f"| {label} | {_f(v['start'], digits)} | {_f(v['end'], digits)} | "
                f"{_f(v['max_first_half'], digits)} | {_f(v['max_second_half'], digits)} | "
                f"{_f(v['slope_per_minute'], 2)} | {_f(v['slope_per_minute_second_half'], 2)} |"
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
            f"| | {_f(rss['before'], 1)} | {_f(rss['peak_during_flood'], 1)} | "
            f"{_f(rss['end'], 1)} |",
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
                lines.append(f"| {label} | {v['n']} | {_f(rate, 1)} | {_row(v, 2)} |")
        lines += [
            "",
            f"The flooding client: {_flood_outcome(fl)}.",
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
                f"Sessions of one client (L6): {_session_limit(lim)}.",
                "",
            ]
        lines += [
            "![flood](flood.png)",
        ]

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
            lines.append(f"| {name} | {_row(v, 2)} | {v['p50'] - base:.2f} |")

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
                    f"{_f(rates[k], 0)} ({_ratio(t['toolpool'][k], rates[k])})" for k in kinds
                )
                + f" | {_f(lat, 1)} |"
            )
        lines.append("")
        lines.append("In parentheses: toolpool's rate as a multiple of that runner's.")
        if peers["ray"]:
            lines += ["", f"Ray: {peers['ray']}."]
        g = peers["grep"]
        lines += [
            "",
            f"**grep** `{g['pattern']}` over `{g['tree']}`: "
            f"raw rg {_f(g['raw_rg_ms']['p50'], 1)} ms, "
            f"through toolpool {_f(g['toolpool_ms']['p50'], 1)} ms "
            f"({_ratio(g['toolpool_ms']['p50'], g['raw_rg_ms']['p50'])}) with the default "
            "CPU quota of one CPU per worker, "
            f"{_f(g['toolpool_all_cores_ms']['p50'], 1)} ms "
            f"({_ratio(g['toolpool_all_cores_ms']['p50'], g['raw_rg_ms']['p50'])}) with "
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


def plots(data: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[Path] = []
    if thr := data.get("throughput"):
        size = max(thr["sizes"])
        kinds = list(dict.fromkeys(c["kind"] for c in thr["cells"]))
        for metric, name, label in (
            ("calls_per_second", "throughput.png", "calls per second"),
            ("p99", "p99.png", "p99 per-call latency (ms)"),
        ):
            fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.4), squeeze=False)
            for ax, kind in zip(axes[0], kinds, strict=True):
                for w in sorted({c["workers"] for c in thr["cells"]}):
                    cells = sorted(
                        (
                            c
                            for c in thr["cells"]
                            if c["kind"] == kind and c["workers"] == w and c["size"] == size
                        ),
                        key=lambda c: c["concurrency"],
                    )
                    xs = [c["concurrency"] for c in cells]
                    ys = [
                        c["calls_per_second"]
                        if metric == "calls_per_second"
                        else c["latency_us"]["p99"] / 1000
                        for c in cells
                    ]
                    (line,) = ax.plot(xs, ys, marker="o", label=f"{w} workers")
                    knee = thr["knees"].get(f"{kind} / {w} workers")
                    if knee in xs:
                        ax.plot(
                            [knee],
                            [ys[xs.index(knee)]],
                            marker="*",
                            markersize=14,
                            color=line.get_color(),
                        )
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [str(x) for x in xs])
                ax.set_title(kind)
                ax.set_xlabel("max_tool_concurrency")
                ax.grid(alpha=0.3)
            axes[0][0].set_ylabel(label)
            axes[0][-1].legend(fontsize=8)
            fig.suptitle(f"turns of {size} calls (★ knee)", fontsize=10)
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            made.append(out / name)
    if over := data.get("overhead"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for name, samples in over["samples_us"].items():
            if name.startswith("direct"):
                continue
            xs = sorted(samples)
            axes[0].plot(xs, [i / len(xs) for i in range(len(xs))], label=name)
        axes[0].set_xscale("log")
        axes[0].set_xlabel("one no-op call, µs")
        axes[0].set_ylabel("fraction of calls")
        axes[0].legend(fontsize=7)
        axes[0].grid(alpha=0.3)
        if intr := data.get("interrupts"):
            for name, samples in intr["samples_ms"].items():
                axes[1].hist(samples, bins=20, alpha=0.6, label=name)
            axes[1].set_xscale("log")
            axes[1].set_xlabel("interrupt → end, ms")
            axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        made.append(out / "latency.png")
    if rec := data.get("recovery"):
        fig, ax = plt.subplots(figsize=(8, 3))
        samples = rec["stream"]["samples"]
        ax.plot(
            [t for t, _ in samples],
            [ms for _, ms in samples],
            ".",
            markersize=3,
            label="no-op call",
        )
        for t in rec["stream"]["crash_times"]:
            ax.axvline(t, color="red", alpha=0.3)
        ax.set_xlabel("seconds (red: a worker crashes)")
        ax.set_ylabel("latency, ms")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "recovery.png", dpi=110)
        plt.close(fig)
        made.append(out / "recovery.png")
    if soak := data.get("soak"):
        samples = soak["samples"]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        ts = [x["t"] for x in samples]
        for ax, key, label in zip(
            axes,
            ("rss", "fds", "threads"),
            ("daemon RSS, MB", "open fds", "threads"),
            strict=True,
        ):
            ys = [x[key] / (MiB if key == "rss" else 1) for x in samples]
            ax.plot(ts, ys, marker=".", markersize=3)
            ax.set_xlabel("seconds")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.set_ylim(0, max(ys, default=1) * 1.2)  # from 0: a leak shows as what it is
        fig.suptitle(f"soak: {soak['clients']} clients, mixed calls", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "soak.png", dpi=110)
        plt.close(fig)
        made.append(out / "soak.png")
    if fl := data.get("flood"):
        fig, ax = plt.subplots(figsize=(8, 3.2))
        steady = fl["steady_samples"]
        ax.plot(
            [t for t, _ in steady],
            [ms for _, ms in steady],
            ".",
            markersize=3,
            label="another client's no-op call, ms",
        )
        ax.set_yscale("log")
        ax.set_xlabel("seconds (shaded: the flooding client reads nothing; dashed: let go)")
        ax.set_ylabel("latency, ms")
        ax.axvspan(*fl["flood_window"], color="orange", alpha=0.15)
        if fl["let_go_at"] is not None:
            ax.axvline(fl["let_go_at"], color="black", alpha=0.5, linestyle="--")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot(
            [t for t, _ in fl["rss_samples"]],
            [r / MiB for _, r in fl["rss_samples"]],
            color="red",
            label="daemon RSS, MB",
        )
        twin.set_ylabel("daemon RSS, MB", color="red")
        twin.set_ylim(bottom=0)
        fig.tight_layout()
        fig.savefig(out / "flood.png", dpi=110)
        plt.close(fig)
        made.append(out / "flood.png")
    return made
