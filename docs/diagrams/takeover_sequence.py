"""Draws docs/_static/takeover-sequence.svg: claim, publish, confirm and takeover.

    python docs/diagrams/takeover_sequence.py     (make plots runs it too)

A script rather than a browser-side diagram library: the site is built without
network access and the image is committed, so it renders anywhere, GitHub
included. The steps follow docs/algorithm.md, sections 3 to 5.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
# text stays text in the SVG (a fifth of the size, and searchable)
matplotlib.rcParams["svg.fonttype"] = "none"
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "_static" / "takeover-sequence.svg"

#: the lifelines, left to right: x position and name
LANES = {
    "a": (0.0, "replica A"),
    "db": (1.0, "database"),
    "broker": (2.0, "broker"),
    "b": (3.0, "replica B"),
}

#: (from, to, label, dashed) per arrow, top to bottom; None draws a note row instead
STEPS: list[tuple[str, str, str, bool] | tuple[str, str]] = [
    ("note", "12:00:00.000 is due: both replicas propose the same slot"),
    ("a", "db", "CLAIM (nightly, 12:00:00): insert, or win an expired unsent row", False),
    ("db", "a", "won: fence 1, lease until now + 15 s", True),
    ("b", "db", "CLAIM (nightly, 12:00:00): the same statement", False),
    ("db", "b", "nothing won: the row is held (lease running)", True),
    ("a", "broker", "publish, task id derived from (entry, slot)", False),
    ("a", "db", "CONFIRM (entry, slot, fence 1, A): state = sent", False),
    ("db", "a", "confirmed", True),
    ("note", "12:01:00.000 is due: A wins it, fence 1, and is SIGKILLed before publishing"),
    ("a", "db", "CLAIM (nightly, 12:01:00)", False),
    ("db", "a", "won: fence 1, lease until 12:01:15 (database clock)", True),
    ("kill", "a"),
    ("note", "the lease runs out; B's sweep (every lease / 3) finds the unsent row"),
    ("b", "db", "SWEEP: take over unsent rows whose lease is over", False),
    ("db", "b", "taken over: (nightly, 12:01:00), fence 2, new lease", True),
    ("b", "broker", "publish again, the same task id", False),
    ("b", "db", "CONFIRM (entry, slot, fence 2, B): state = sent", False),
    ("db", "b", "confirmed; a confirm carrying fence 1 would match no row", True),
]


def draw(path: Path = OUT) -> Path:
    rows = len(STEPS)
    fig, ax = plt.subplots(figsize=(10, 0.42 * rows + 1.2))
    top, step = rows + 0.5, 1.0
    for x, name in LANES.values():
        ax.plot([x, x], [0.2, top], color="#999999", linewidth=1, zorder=0)
        ax.text(
            x,
            top + 0.35,
            name,
            ha="center",
            va="center",
            fontsize=10,
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.4", "facecolor": "#eef3fa", "edgecolor": "#5b7db1"},
        )
    y = top - 0.6
    dead_from: float | None = None
    for item in STEPS:
        if item[0] == "note":
            ax.text(
                1.5,
                y,
                item[1],
                ha="center",
                va="center",
                fontsize=8.5,
                style="italic",
                bbox={"boxstyle": "square,pad=0.3", "facecolor": "#fff8dc", "edgecolor": "#d9c27a"},
            )
        elif item[0] == "kill":
            x = LANES[item[1]][0]
            ax.plot(x, y, marker="X", markersize=16, color="#c0392b", zorder=3)
            ax.text(
                x + 0.08,
                y,
                "SIGKILL",
                va="center",
                fontsize=8.5,
                color="#c0392b",
                fontweight="bold",
            )
            dead_from = y
        else:
            source, target, label, reply = item  # type: ignore[misc]
            x0, x1 = LANES[source][0], LANES[target][0]
            ax.annotate(
                "",
                xy=(x1, y),
                xytext=(x0, y),
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": "#333333",
                    "linestyle": "--" if reply else "-",
                    "linewidth": 1,
                },
            )
            ax.text(
                (x0 + x1) / 2,
                y + 0.12,
                label,
                ha="center",
                va="bottom",
                fontsize=7.8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
            )
        y -= step
    if dead_from is not None:  # the killed replica's lifeline, greyed below the kill
        x = LANES["a"][0]
        ax.plot([x, x], [0.2, dead_from - 0.2], color="white", linewidth=3, zorder=1)
        ax.plot(
            [x, x], [0.2, dead_from - 0.2], color="#dddddd", linewidth=1, zorder=2, linestyle=":"
        )
    ax.set_xlim(-0.45, 3.45)
    ax.set_ylim(0, top + 0.8)
    ax.axis("off")
    path.parent.mkdir(parents=True, exist_ok=True)
    # no date in the file: drawing it again gives the same bytes
    fig.savefig(path, bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(f"diagram: {draw()}")
