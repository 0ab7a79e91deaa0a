"""The bench's PNG plots (matplotlib is imported here only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.format import MiB


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
