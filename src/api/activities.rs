//! Activity endpoints: `POST /{record_segment}/{activity_segment}/` creates,
//! `PUT` and `DELETE /{record_segment}/{activity_segment}/{id}` update and delete. The record
//! segment in the path does not constrain the parent: the parent id decides.

use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, scalar_text};
use super::output::Out;
use super::{Ctx, Reply};
use crate::model::FieldValues;
use crate::model::activity::ActivityType;
use crate::store::{ActivityChanges, NewActivity, Place};
use crate::timefmt;

pub fn create(ctx: &Ctx<'_>, kind: ActivityType) -> Result<Reply, ApiError> {
    let body = &ctx.body;
    only_keys(body, &["parent", "data", "after", "before"])?;
    let p = Params::new(body);
    let parent = p
        .int("parent")
        .map_err(|_| ApiError::invalid_value("parent", "must be an item id"))?
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::invalid_value("parent", "is required: the id of the record or activity to add to"))?;
    let fields = data_fields(kind, body.get("data"))?;
    if kind.is_dated_action() && ActivityType::completed(&fields) {
        return Err(ApiError::invalid_value(
            "completed",
            format!("a new {} cannot be created completed", kind.segment()),
        ));
    }
    for required in kind.required_fields() {
        if fields.get(*required).is_none_or(|v| v.is_empty()) {
            return Err(ApiError::invalid_value(required, "is required"));
        }
    }
    let place = place_of(&p)?;
    let stored: FieldValues =
        fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let created = ctx.app.store.create_activity(&ctx.viewer, NewActivity { kind, parent, fields: stored, place })?;
    let mut data = Out::map();
    for f in kind.fields() {
        if let Some(v) = fields.get(f.name) {
            data.push(f.name, Out::text(v.clone()));
        }
    }
    let doc = Out::map()
        .with("id", Out::Int(created.id))
        .with("data", data)
        .with("created", Out::text(timefmt::short(created.created)));
    Ok(Reply { status: 201, doc, location: None })
}

pub fn update(ctx: &Ctx<'_>, kind: ActivityType, id: i64) -> Result<Reply, ApiError> {
    let body = &ctx.body;
    only_keys(body, &["parent", "data", "after", "before"])?;
    let p = Params::new(body);
    let parent =
        p.int("parent").map_err(|_| ApiError::invalid_value("parent", "must be an item id"))?.filter(|id| *id > 0);
    let changes = ActivityChanges { fields: data_fields(kind, body.get("data"))?, place: place_of(&p)?, parent };
    ctx.app.store.update_activity(&ctx.viewer, kind, id, changes)?;
    Ok(Reply::ok(Out::map()))
}

pub fn delete(ctx: &Ctx<'_>, kind: ActivityType, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.delete_activity(&ctx.viewer, kind, id)?;
    Ok(Reply::ok(Out::map()))
}

fn only_keys(body: &Value, allowed: &[&str]) -> Result<(), ApiError> {
    if let Value::Object(m) = body
        && let Some(other) = m.keys().find(|k| !allowed.contains(&k.as_str()))
    {
        return Err(ApiError::incorrect_field(other));
    }
    Ok(())
}

/// The fields inside `data`, checked against the type; an empty value clears a field.
fn data_fields(kind: ActivityType, data: Option<&Value>) -> Result<FieldValues, ApiError> {
    let mut out = FieldValues::new();
    let map = match data {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::String(s)) if s.is_empty() => return Ok(out),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ApiError::invalid_value("data", "must hold the activity's fields")),
    };
    for (name, value) in map {
        let field = kind.field(name).ok_or_else(|| ApiError::incorrect_field(name))?;
        let text = match value {
            Value::Null => String::new(),
            other => scalar_text(other).ok_or_else(|| ApiError::invalid_value(name, "must be a single value"))?,
        };
        let normalized = field.kind.normalize(&text).map_err(|m| ApiError::invalid_value(name, m))?;
        out.insert(name.clone(), normalized);
    }
    Ok(out)
}

fn place_of(p: &Params<'_>) -> Result<Option<Place>, ApiError> {
    let after = p.int("after").map_err(|_| ApiError::invalid_value("after", "must be an activity id"))?;
    let before = p.int("before").map_err(|_| ApiError::invalid_value("before", "must be an activity id"))?;
    match (after, before) {
        (Some(_), Some(_)) => Err(ApiError::invalid_value("after", "give after or before, not both")),
        (Some(a), None) => Ok(Some(Place::After(a))),
        (None, Some(b)) => Ok(Some(Place::Before(b))),
        (None, None) => Ok(None),
    }
}
