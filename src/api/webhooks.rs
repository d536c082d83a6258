//! Webhook management (`/hooks`), their deliveries, and the payloads they carry.

use std::sync::Arc;

use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, only_keys};
use super::output::{self, Out};
use super::records::{activity_out, detail_out};
use super::{Ctx, Reply, members};
use crate::limits;
use crate::model::hook::{ACTIVITY_CONSTRAINTS, ContentType, Event, ITEM_CONSTRAINTS, constraint_allowed};
use crate::model::{CustomField, check_text};
use crate::store::{Content, DeliveryInfo, Hook, HookSettings, Notification, Render};
use crate::timefmt::iso;

/// Renders notifications: `<notification><type/><objectid/><content/></notification>`, where
/// content is what Show returns (item, activities, categories, related items), or for an
/// activity the activity as Show lists it with its record's id and type.
pub struct Payloads {
    pub fields: Arc<Vec<CustomField>>,
    /// The site's time zone (alert timestamps).
    pub timezone: jiff::tz::TimeZone,
}

impl Render for Payloads {
    fn render(&self, n: &Notification<'_>, contenttype: ContentType) -> Vec<u8> {
        let content = match &n.content {
            Content::Record(detail) => detail_out(&self.fields, (*detail).clone()),
            Content::Activity { activity, record_id, record_type } => Out::map()
                .with("activity", activity_out(*record_type, activity))
                .with("itemid", Out::Int(*record_id))
                .with("itemtype", Out::Int(record_type.typeid())),
            Content::Alert(alert) => Out::map().with("alert", super::alerts::alert_out(&self.timezone, alert)),
        };
        let doc = Out::map()
            .with("type", Out::text(n.event.as_str()))
            .with("objectid", Out::Int(n.object_id))
            .with("content", content);
        let members = members(doc);
        match contenttype {
            ContentType::Xml => output::to_xml_root("notification", &members).into_bytes(),
            ContentType::Json => output::to_json_bytes(&members),
            ContentType::Form => output::to_form(&members).into_bytes(),
        }
    }
}

fn hook_out(h: &Hook) -> Out {
    Out::map()
        .with("id", Out::Int(h.id))
        .with("type", Out::text("web"))
        .with("title", Out::text(h.title.clone()))
        .with("event", Out::text(h.event.as_str()))
        .with("active", Out::Int(i64::from(h.active)))
        .with("url", Out::text(h.url.clone()))
        .with("contenttype", Out::text(h.contenttype.as_str()))
        .with("secret", Out::text(h.secret.clone()))
        .with("constrainttype", Out::text(h.constrainttype.clone()))
        .with("owner", Out::Int(h.owner))
        .with("paused", Out::Int(i64::from(h.paused)))
        .with("pending", Out::Int(h.pending))
        .with("failed", Out::Int(h.failed))
}

/// The keys a hook is set by, and those an answer shows that a client sends back unchanged
/// (a hook read, changed and written whole): taken and not heeded, but an `id` other than the
/// hook's.
const HOOK_KEYS: &[&str] = &[
    "type",
    "title",
    "active",
    "event",
    "constrainttype",
    "url",
    "contenttype",
    "secret",
    "id",
    "owner",
    "paused",
    "pending",
    "failed",
];

/// Reads hook settings from a body over `base` (a new hook: the defaults).
fn settings(body: &Value, base: Option<&Hook>) -> Result<HookSettings, ApiError> {
    // A hook as `GET /hooks/{id}` answers it, sent back whole: `{"hook": {...}, "status": ...}`
    // (in XML `<response><hook>...</hook><status>...`) is read as its `hook`.
    let body = match body {
        Value::Object(m)
            if m.get("hook").is_some_and(Value::is_object) && m.keys().all(|k| k == "hook" || k == "status") =>
        {
            &m["hook"]
        }
        other => other,
    };
    only_keys(body, HOOK_KEYS)?;
    let p = Params::new(body);
    if let Some(h) = base
        && let Some(id) = p.int("id").map_err(|_| ApiError::invalid_value("id", "must be a number"))?
        && id != h.id
    {
        return Err(ApiError::invalid_value("id", format!("is {id}, not the hook's {}", h.id)));
    }
    let text = |key: &str| -> Result<Option<String>, ApiError> {
        let v = p.text(key).map_err(|_| ApiError::invalid_value(key, "must be text"))?;
        if let Some(v) = &v {
            if p.sent_bytes(key) > limits::WEBHOOK_TEXT_BYTES_MAX {
                return Err(ApiError::invalid_value(
                    key,
                    format!("is longer than {} bytes", limits::WEBHOOK_TEXT_BYTES_MAX),
                ));
            }
            check_text(v).map_err(|e| ApiError::invalid_value(key, e))?;
        }
        Ok(v)
    };
    if text("type")?.is_some_and(|t| t != "web") {
        return Err(ApiError::invalid_value("type", "must be web"));
    }
    let event = match text("event")? {
        Some(e) => Event::parse(&e).ok_or_else(|| {
            let all: Vec<&str> = Event::ALL.iter().map(|e| e.as_str()).collect();
            ApiError::invalid_value("event", format!("must be one of: {}", all.join(", ")))
        })?,
        None => base.map(|h| h.event).ok_or_else(|| ApiError::invalid_value("event", "is required"))?,
    };
    let constrainttype = match text("constrainttype")? {
        Some(c) if !c.is_empty() => c,
        _ => match base {
            // Keep the constraint unless the event moved to the other family.
            Some(h) if constraint_allowed(event, &h.constrainttype) => h.constrainttype.clone(),
            _ => "all".to_string(),
        },
    };
    if !constraint_allowed(event, &constrainttype) {
        let allowed: &[&str] = if event.is_alerts() {
            &["all"]
        } else if event.is_items() {
            ITEM_CONSTRAINTS
        } else {
            ACTIVITY_CONSTRAINTS
        };
        return Err(ApiError::invalid_value(
            "constrainttype",
            format!("for {} must be one of: {}", event.as_str(), allowed.join(", ")),
        ));
    }
    let url = match text("url")? {
        Some(u) => u,
        None => base.map(|h| h.url.clone()).ok_or_else(|| ApiError::invalid_value("url", "is required"))?,
    };
    let url = check_url(&url)?;
    let contenttype = match text("contenttype")? {
        Some(c) if !c.is_empty() => {
            ContentType::parse(&c).ok_or_else(|| ApiError::invalid_value("contenttype", "must be xml, json or form"))?
        }
        _ => base.map(|h| h.contenttype).unwrap_or(ContentType::Xml),
    };
    let active = match p.flag("active").map_err(|_| ApiError::invalid_value("active", "must be 0 or 1"))? {
        Some(a) => a,
        None => base.map(|h| h.active).unwrap_or(true),
    };
    Ok(HookSettings {
        title: text("title")?.or_else(|| base.map(|h| h.title.clone())).unwrap_or_default(),
        active,
        event,
        constrainttype,
        url,
        contenttype,
        secret: text("secret")?.or_else(|| base.map(|h| h.secret.clone())).unwrap_or_default(),
    })
}

/// An http or https URL with a host.
/// The hook's URL as it is kept: as given, or, where a request line could not carry it, as a
/// browser would send it (an international host name in its `xn--` form; spaces, quotes and
/// the like percent-encoded).
fn check_url(url: &str) -> Result<String, ApiError> {
    let bad = || ApiError::invalid_value("url", "must be an http:// or https:// URL with a host");
    let url = match url.parse::<http::Uri>() {
        Ok(uri) if uri.host().is_some_and(|h| h.is_ascii()) => url.to_string(),
        _ => match url::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => parsed.to_string(),
            _ => return Err(bad()),
        },
    };
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => {}
        _ => return Err(bad()),
    }
    // A port, if given, is 1..=65535 (`:99999` would otherwise wrap around to another port).
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let port = match host_port.rsplit_once(']') {
        Some((_, rest)) => rest.strip_prefix(':'),
        None => host_port.split_once(':').map(|(_, p)| p),
    };
    if let Some(port) = port
        && !port.is_empty()
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err(ApiError::invalid_value("url", format!("has port {port}: a port is 1 to 65535")));
    }
    Ok(url)
}

pub fn create(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let s = settings(&ctx.body, None)?;
    let hook = ctx.app.store.create_hook(&ctx.viewer, &s)?;
    let doc = Out::map()
        .with("active", Out::Int(i64::from(hook.active)))
        .with("type", Out::text("web"))
        .with("event", Out::text(hook.event.as_str()))
        .with("title", Out::text(hook.title.clone()))
        .with("url", Out::text(hook.url.clone()))
        .with("contenttype", Out::text(hook.contenttype.as_str()))
        .with("secret", Out::text(hook.secret.clone()))
        .with("constrainttype", Out::text(hook.constrainttype.clone()))
        .with("id", Out::Int(hook.id));
    Ok(Reply { status: 201, doc, location: Some(format!("/hooks/{}", hook.id)) })
}

pub fn list(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let hooks = ctx.app.store.hooks(&ctx.viewer)?;
    Ok(Reply::ok(Out::map().with("hooks", Out::list("hook", hooks.iter().map(hook_out).collect()))))
}

pub fn show(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    let hook = ctx.app.store.hook(&ctx.viewer, id)?;
    Ok(Reply::ok(Out::map().with("hook", hook_out(&hook))))
}

pub fn update(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    // Only `active` 1 in this request resumes a paused hook (a change of its title does not).
    let resume = Params::new(&ctx.body).flag("active").ok().flatten() == Some(true);
    // The keys left out keep their values, read in the write itself.
    ctx.app.store.update_hook(&ctx.viewer, id, resume, |current| settings(&ctx.body, Some(current)))??;
    Ok(Reply::ok(Out::map()))
}

pub fn delete(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.delete_hook(&ctx.viewer, id)?;
    Ok(Reply::ok(Out::map()))
}

fn delivery_out(d: &DeliveryInfo) -> Out {
    Out::map()
        .with("id", Out::Int(d.id))
        .with("event", Out::text(d.event.clone()))
        .with("objectid", Out::Int(d.object_id))
        .with("state", Out::text(d.state.as_str()))
        .with("attempts", Out::Int(d.attempts))
        .with("created", Out::Time(d.created))
        .with("nextattempt", Out::text(if d.finished.is_none() { iso(d.next_at) } else { String::new() }))
        .with("finished", Out::text(d.finished.map(iso).unwrap_or_default()))
        .with("laststatus", Out::text(d.last_status.map(|s| s.to_string()).unwrap_or_default()))
        .with("lasterror", Out::text(d.last_error.clone()))
}

/// `GET /hooks/{id}/deliveries`: the newest deliveries first (`limit`, default 100).
pub fn deliveries(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    let params = ctx.params();
    let limit =
        Params::new(&params).int_within("limit", 1, i64::from(limits::WEBHOOK_DELIVERIES_LISTED_MAX), 100)? as u32;
    let list = ctx.app.store.deliveries(&ctx.viewer, id, limit)?;
    Ok(Reply::ok(Out::map().with("deliveries", Out::list("delivery", list.iter().map(delivery_out).collect()))))
}

/// `POST /hooks/{id}/deliveries/{delivery}/retry`: a failed delivery goes out again.
pub fn retry(ctx: &Ctx<'_>, id: i64, delivery: i64) -> Result<Reply, ApiError> {
    ctx.app.store.retry_delivery(&ctx.viewer, id, delivery)?;
    Ok(Reply::ok(Out::map()))
}
