"""Who is looking, and what they may see.

The app resolves the viewer once per script run (`sing.dashboards.identity`), before any page
renders, and only registers the pages the viewer's role may open, so a page's URL is no way around
the role. The one rule finer than a page is job ownership: a user sees the details of their own jobs
only (others appear in aggregates, under neutral labels), `may_see_job` says so, and the data
module takes the owner as a filter as well.

Roles: admin (everything, real names), user (own jobs in detail), researcher (anonymized data:
aggregates, the anonymized trace export, the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass

from sing.dashboards.settings import RoleSettings

ADMIN, USER, RESEARCHER = "admin", "user", "researcher"
ROLES = (ADMIN, USER, RESEARCHER)


@dataclass(frozen=True)
class Viewer:
    """A signed-in person (or a demo visitor) with a role."""

    name: str  # cluster user name
    role: str
    demo: bool = False

    def may_see_job(self, owner: str | None) -> bool:
        return self.role == ADMIN or (
            self.role == USER and owner is not None and owner == self.name
        )

    def owner_filter(self) -> str | None:
        """The `user` a job query must be restricted to (None: all jobs)."""
        return None if self.role == ADMIN else self.name


@dataclass(frozen=True)
class PageSpec:
    """One page of the app: its file under sing/dashboards/, title, URL, the roles that see it."""

    file: str
    title: str
    url_path: str
    roles: tuple[str, ...]
    icon: str


PAGES = (
    PageSpec("pages/cluster.py", "Cluster", "cluster", ROLES, ":material/dns:"),
    PageSpec("pages/idle_jobs.py", "Idle jobs", "idle", (ADMIN,), ":material/hourglass_empty:"),
    PageSpec("pages/policy.py", "Waste policies", "policy", (ADMIN,), ":material/gavel:"),
    PageSpec("pages/health.py", "Health", "health", (ADMIN,), ":material/health_and_safety:"),
    PageSpec("pages/by_node_count.py", "By node count", "nodes", ROLES, ":material/bar_chart:"),
    PageSpec("pages/fairness.py", "Fairness", "fairness", ROLES, ":material/balance:"),
    PageSpec("pages/my_jobs.py", "My jobs", "my-jobs", (ADMIN, USER), ":material/person:"),
    PageSpec("pages/accounting.py", "Accounting", "accounting", (ADMIN, USER), ":material/paid:"),
    PageSpec("pages/job.py", "Job", "job", (ADMIN, USER), ":material/monitoring:"),
    PageSpec("pages/traces.py", "Traces", "traces", (ADMIN, RESEARCHER), ":material/download:"),
    PageSpec("pages/simulator.py", "Simulator", "simulator", ROLES, ":material/science:"),
    PageSpec(
        "pages/workload.py", "Workload", "workload", (ADMIN, RESEARCHER), ":material/ssid_chart:"
    ),
)


def pages_for(role: str) -> list[PageSpec]:
    return [p for p in PAGES if role in p.roles]


def role_of(name: str, roles: RoleSettings) -> str:
    if name in roles.admins:
        return ADMIN
    if name in roles.researchers:
        return RESEARCHER
    return USER


def holder_label(owner: str | None, viewer: Viewer) -> str:
    """Who holds a GPU, as `viewer` may see it: admins see the user, users see "you" or
    "other job", researchers only "in use"."""
    if owner is None:
        return ""
    if viewer.role == ADMIN:
        return owner
    if viewer.role == USER:
        return "you" if owner == viewer.name else "other job"
    return "in use"


def user_labels(users: list[str], viewer: Viewer) -> list[str]:
    """Names as `viewer` may see them: admins see real names; everybody else sees their own
    name and "user 1", "user 2", ... (in the order given) for the others."""
    if viewer.role == ADMIN:
        return list(users)
    labels, n = [], 0
    for name in users:
        if viewer.role == USER and name == viewer.name:
            labels.append(f"{name} (you)")
        else:
            n += 1
            labels.append(f"user {n}")
    return labels
