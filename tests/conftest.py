"""Say once, visibly, when the tests that need MNIST are skipped and why."""

import dtemu.host  # noqa: F401  before any test loads torch: the CPU arithmetic of every run (host.cpu_arith)

from helpers import DATA, HAVE_MNIST


def pytest_report_header(config):
    if HAVE_MNIST:
        return f"MNIST archives: {DATA}"
    return (f"MNIST archives NOT FOUND under {DATA}: the tests that need them are skipped "
            "(set DTEMU_DATA to a folder holding MNIST/raw/*.gz)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not HAVE_MNIST:
        skipped = len(terminalreporter.stats.get("skipped", []))
        terminalreporter.write_line(f"note: {skipped} tests skipped: no MNIST archives under {DATA} "
                                    "(set DTEMU_DATA)", yellow=True)
