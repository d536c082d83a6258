#!/usr/bin/env python3
"""Gives a fresh sitegate something to show, and checks every answer against the OpenAPI
description on the way.

    python3 tests/schema/seed.py BASE_URL EMAIL TOKEN SCHEMA.json

Creates a category tag, a company, a contact related to it, a project blog and a ticket, one
activity of every type (a file activity with an uploaded file among them), a hook (its URL is
on the loopback address, port 9, where nothing listens) and a device; then reads them back
through Show, the lists, every report, the hook's deliveries and the location calls. Each
answer's status must be one the description lists for that call, and a JSON answer must match
that status's schema. Prints one line per failure and `N passed, N failed`; exits 1 on any
failure. Needs the Python packages schemathesis brings (jsonschema, openapi-schema-validator).
"""

import base64
import datetime
import json
import re
import sys
import urllib.error
import urllib.request

from openapi_schema_validator import OAS30Validator

BASE, EMAIL, TOKEN, SCHEMA = sys.argv[1:5]
SPEC = json.load(open(SCHEMA, encoding="utf-8"))
AUTH = "Basic " + base64.b64encode(f"{EMAIL}:{TOKEN}".encode()).decode()
TODAY = datetime.date.today()
SOON = (TODAY + datetime.timedelta(days=3)).isoformat()
passed, failed = 0, 0


def template_of(method, path):
    """The description's path template that a concrete call falls under."""
    best = None
    for template in SPEC["paths"]:
        if method.lower() not in SPEC["paths"][template]:
            continue
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "/?$"
        if re.match(pattern, path):
            literal = len(re.sub(r"\{[^}]+\}", "", template))
            if best is None or literal > best[0]:
                best = (literal, template)
    return best[1] if best else None


def resolve(node):
    while isinstance(node, dict) and "$ref" in node:
        name = node["$ref"].split("/")
        node = SPEC[name[1]][name[2]][name[3]]
    return node


def check(method, path, status, content_type, body):
    """Whether the answer is one the description gives for this call."""
    template = template_of(method, path.split("?")[0])
    if template is None:
        return f"no path of the description takes {method} {path}"
    operation = SPEC["paths"][template].get(method.lower())
    if operation is None:
        return f"{method} {template} is not described"
    response = operation["responses"].get(str(status))
    if response is None:
        return f"status {status} is not described for {method} {template}"
    response = resolve(response)
    media = content_type.split(";")[0].strip()
    content = response.get("content", {})
    if media not in content and "*/*" not in content:
        return f"content type {media} is not described for {method} {template} {status}"
    if media == "application/json":
        schema = dict(content[media]["schema"], components=SPEC["components"])
        errors = sorted(OAS30Validator(schema).iter_errors(json.loads(body)), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            return f"{method} {path} {status}: {'/'.join(map(str, e.path))}: {e.message[:300]}"
    return None


def call(method, path, body=None, expect=(200,), content_type="application/json", raw=None):
    global passed, failed
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Authorization", AUTH)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, ctype, text = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        status, ctype, text = e.code, e.headers.get("Content-Type", ""), e.read()
    problem = check(method, path, status, ctype, text)
    if problem is None and status not in expect:
        problem = f"{method} {path}: status {status}, expected {expect}: {text[:300]!r}"
    if problem:
        failed += 1
        print(f"seed: FAILED {problem}")
    else:
        passed += 1
    return json.loads(text) if ctype.startswith("application/json") else text


# Records
tag = call("POST", "/contacts/categories", {"name": "VIP"}, (201,))["id"]
company = call("POST", "/companies", {"name": "Workplate Ltd", "phone": "+44 20 7946 0000", "website": "https://workplate.example"}, (201,))["item"]["id"]
contact = call(
    "POST",
    "/contacts",
    {
        "firstname": "Ann",
        "lastname": "Lee",
        "businessemail": "ann@workplate.example",
        "cellularphone": "+44 7700 900123",
        "assignedto": 1,
        "flagged": 1,
        "categories": {"add": [tag]},
        "relateditems": {"add": {"relatedto": [{"id": company, "note": "employer"}]}},
    },
    (201,),
)["item"]["id"]
blog = call("POST", "/projectblogs", {"title": "Fit-out", "description": "Phase 1"}, (201,))["item"]["id"]
ticket = call(
    "POST",
    "/tickets",
    {"title": "Door 3 sticks", "status": "open", "priority": "high", "requesteremail": "ops@workplate.example", "duedate": SOON},
    (201,),
)["item"]["id"]


# Activities: one of every type, each under a parent it may have.
def activity(kind, parent, data, segment="contacts"):
    return call("POST", f"/{segment}/{kind}", {"parent": parent, "data": data}, (201,))["id"]


deal = activity("opportunity", contact, {"description": "Access control", "valueunit": "1250.50", "valuecurrency": "eur", "valueinterval": "per month", "valueduration": 12, "stage": 40, "probability": 60, "closingdate": SOON, "responsible": 1, "status": "pending"})
activity("comment", deal, {"post": "Sent the offer"})
activity("followup", contact, {"details": "Call back", "assignedto": 1, "duedate": SOON, "remindtime": 30})
activity("onlinedoc", company, {"title": "Floor plan", "url": "https://workplate.example/plan"}, "companies")
talk = activity("call", contact, {"details": "Site visit", "dateoccured": f"{TODAY} 09:30:00", "duration": 45})
activity("timerecord", talk, {"date": TODAY.isoformat(), "person": 1, "hours": 1.5, "billable": 1, "details": "Visit"})
activity("linkedemails", contact, {"fields": "businessemail", "keywords": "quote, offer"})
note = activity("note", contact, {"details": "Prefers mornings"})
remark = activity("comment", note, {"post": "Noted"})
activity("attachment", remark, {"file": "minutes.txt"})
album = activity("photolist", contact, {"title": "Lobby"})
activity("photo", album, {"caption": "Door 3", "file": "door3.jpg"})
plan = activity("tasklist", blog, {"title": "Install", "milestonedate": SOON}, "projectblogs")
task = activity("task", plan, {"title": "Mount readers", "assignedto": 1, "duedate": SOON, "priority": 3, "timespent": 2, "timespentmeasure": "hours", "notifyoncomplete": "ops@workplate.example"}, "projectblogs")
activity("timerecord", task, {"date": TODAY.isoformat(), "person": 1, "hours": 3, "billable": 0, "invoiced": "INV-1"}, "projectblogs")
activity("website", ticket, {"caption": "Vendor", "url": "https://vendor.example"}, "tickets")
activity("accountingwidget", contact, {"contactid": 4711})
activity("helpdeskwidget", contact, {"userid": 815})
boundary = "seedboundary7f3a"
upload = (
    f"--{boundary}\r\nContent-Disposition: form-data; name=\"parent\"\r\n\r\n{task}\r\n"
    f"--{boundary}\r\nContent-Disposition: form-data; name=\"data[caption]\"\r\n\r\nWiring\r\n"
    f"--{boundary}\r\nContent-Disposition: form-data; name=\"data[file]\"; filename=\"wiring.txt\"\r\n"
    "Content-Type: text/plain\r\n\r\nreader 1: red, reader 2: blue\r\n"
    f"--{boundary}--\r\n"
).encode()
stored = call("POST", "/projectblogs/file", expect=(201,), content_type=f"multipart/form-data; boundary={boundary}", raw=upload)["id"]
gone = activity("note", contact, {"details": "Draft"})
call("DELETE", f"/contacts/note/{gone}")
call("POST", f"/contacts/note/{gone}/restore")

# A hook whose deliveries go to the loopback address, where nothing listens; a device.
hook = call("POST", "/hooks", {"title": "CRM sync", "event": "items.update", "url": "http://127.0.0.1:9/hook", "contenttype": "json", "secret": "s3cret"}, (201,))["id"]
call("PUT", f"/contacts/{contact}", {"jobtitle": "Facilities manager", "categories": {"remove": [tag]}})
call("PUT", f"/contacts/{contact}", {"categories": {"add": [tag]}})
device = call("POST", "/devices", {"deviceaddress": "5/1/22", "label": "Badge 22", "beacon": "mac:AA:BB:CC:DD:EE:22", "contactid": contact}, (201,))["device"]["id"]
call("POST", "/devices", {"deviceaddress": "5/1/23", "deviceid": "visitor-23", "beacon": "eddystone:00112233445566778899/aabbccddeeff"}, (201,))

# Read it all back.
call("GET", f"/contacts/{contact}")
call("GET", f"/companies/{company}")
call("GET", f"/projectblogs/{blog}")
call("GET", f"/tickets/{ticket}")
call("GET", "/contacts?layout=1&categories=1")
call("GET", "/companies")
call("GET", "/projectblogs?layout=1&fields=title")
call("GET", "/tickets?layout=1&sortfield=created&sortdir=desc")
call("GET", "/contacts?filtermode=category&filtervalue=" + str(tag) + "&searchvalue=Ann")
call("GET", "/contacts/fields")
call("GET", "/tickets/fields")
call("GET", "/contacts/categories")
call("GET", "/ownership?deleted=1")
call("GET", f"/projectblogs/file/{stored}/file")
wide = "start=2000-01-01&end=2099-12-31"
for report in ["nextactions?itemsdata=1", "followups?itemsdata=1", "opportunities?itemsdata=1", f"activities?{wide}&itemsdata=1", f"timetracking?{wide}&itemsdata=1", "calendar"]:
    call("GET", f"/report/{report}")
call("GET", "/hooks")
call("GET", f"/hooks/{hook}")
call("GET", f"/hooks/{hook}/deliveries")
call("GET", "/devices")
call("GET", f"/devices/{device}")
call("GET", "/locate")
call("POST", "/locate", {"searchvalue": "Ann", "historyminutes": 60})
for report in ["timebydevice", "timebyzone", "timesummary"]:
    call("POST", f"/report/{report}", {"detailed": 1})
call("GET", "/report/timebydevice?deviceaddress=5/1/22")
call("GET", "/report/lastseen")
call("GET", "/battery")
call("GET", f"/contacts/{contact}/locations")
call("GET", "/alerts?all=1")
call("GET", "/status/snapshot")
call("GET", "/health")

print(f"seed: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
