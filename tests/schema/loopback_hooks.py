"""Schemathesis hooks for tests/schema/run.sh: keeps the service's outgoing traffic on loopback.

Webhooks deliver to the URL a hook names, and the generated hooks name any host. Before each
request, a hook URL in a JSON body that the service would accept (`http://` or `https://`
with a host) is pointed at 127.0.0.1 port 9, where nothing listens; the scheme, path and query
stay, so what the service accepts or refuses does not change.
"""

import re

import schemathesis

URL = re.compile(r"^(\s*[Hh][Tt][Tt][Pp][Ss]?://)([^/?#]*)(.*)$", re.DOTALL)


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("url"), str):
        return
    match = URL.match(body["url"])
    if match and match.group(2):
        body["url"] = f"{match.group(1)}127.0.0.1:9{match.group(3)}"
