"""The dashboard's entry script (`sing dashboard` runs it with `streamlit run`).

Every script run starts here: identify the viewer (`sing.dashboards.identity`), refuse anybody who
is not proved, then register only the pages the viewer's role may open and run the chosen one.
Pages never check identity themselves; they read the `Visit` this script stored.

Environment (set by `sing dashboard`): SING_CONFIG, SING_WAREHOUSE. Demo mode only from the
script's own argument `--demo` (`sing dashboard --demo` runs `streamlit run app.py -- --demo`),
never from the environment, which a shell or unit file hands down unseen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st
from streamlit.errors import StreamlitSecretNotFoundError

from sing.config import Config, ConfigError
from sing.dashboards import access, data
from sing.dashboards.cli import DEMO_ARG
from sing.dashboards.identity import PROXY_SECRET_HEADER, Refusal, identify, read_proxy_secret
from sing.dashboards.settings import DashboardSettings, RoleSettings
from sing.dashboards.widgets import VISIT_KEY, Visit

HERE = Path(__file__).parent


def sign_in_configured() -> bool:
    """Whether .streamlit/secrets.toml has the [auth] section st.login needs."""
    try:
        return "auth" in st.secrets
    except StreamlitSecretNotFoundError:  # no secrets file at all
        return False


st.set_page_config(page_title="sing", page_icon=":material/memory:", layout="wide")

config = Config.load()
settings = config.section("dashboard", DashboardSettings)
roles = config.section("roles", RoleSettings)
warehouse = str(config.warehouse_dir())
demo = DEMO_ARG in sys.argv[1:]


def sign_in() -> access.Viewer | Refusal | None:
    """Who this run's request proves to be; the proxy's secret is read on every run, so a new
    one counts without a restart."""
    secret = None
    if settings.auth == "header":
        try:
            secret = read_proxy_secret(config.resolve_path(settings.proxy_secret_file))
        except ConfigError as err:  # `sing dashboard` checked it at start; it changed since
            return Refusal(f"The dashboard cannot check the sign-in proxy: {err}")
    headers = {
        h: st.context.headers.get_all(h) for h in (settings.user_header, PROXY_SECRET_HEADER)
    }
    return identify(settings, roles, st.user.to_dict(), headers, secret)


viewer = sign_in()
st.session_state.pop(VISIT_KEY, None)

if viewer is None and demo:
    with st.sidebar:
        st.subheader("Demo: view as")
        role = st.selectbox("Role", access.ROLES, key="demo_role")
        names = data.users(warehouse) or ["demo"]
        name = st.selectbox("User", names, key="demo_user") if role == access.USER else "demo"
    viewer = access.Viewer(name, role, demo=True)


def sign_in_screen() -> None:
    st.title("sing")
    if isinstance(viewer, Refusal):
        st.error(f"Not signed in. {viewer.reason}")
    elif not sign_in_configured():
        st.error(
            "Sign-in is not configured: add an [auth] section to .streamlit/secrets.toml "
            "(see docs/dashboards.md), or start `sing dashboard --demo`."
        )
    else:
        st.info("Sign in to see the cluster.")
        st.button("Sign in", on_click=st.login, type="primary")
    if st.user.get("is_logged_in"):
        st.button("Sign out", on_click=st.logout)


if not isinstance(viewer, access.Viewer):
    # Calling st.navigation (with only this screen) also keeps Streamlit from serving the files
    # in sing/dashboards/pages/ as pages of their own, which it does for apps that never call it.
    st.navigation([st.Page(sign_in_screen, title="Sign in")], position="hidden").run()
    st.stop()

st.session_state[VISIT_KEY] = Visit(viewer, warehouse, config, demo)


def page_of(spec: access.PageSpec, **extra: object) -> st.Page:
    """The page of `spec`; `extra` sets its URL path and whether it is the root."""
    return st.Page(str(HERE / spec.file), title=spec.title, icon=spec.icon, **extra)


specs = access.pages_for(viewer.role)
# Streamlit serves the default page at `/` and gives it no other URL, so were the first page the
# default, `/cluster` would be "Page not found". The default is a hidden second entry of the
# first page's file instead (one file may stand under two URL paths), and every page keeps its
# own URL.
root = page_of(specs[0], url_path="home", default=True, visibility="hidden")
page = st.navigation([root, *(page_of(spec, url_path=spec.url_path) for spec in specs)])
with st.sidebar:
    st.caption(f"Signed in as **{viewer.name}** ({viewer.role})")
    if not viewer.demo and settings.auth == "oidc":
        st.button("Sign out", on_click=st.logout)

page.run()
