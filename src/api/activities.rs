//! Activity endpoints: `POST /{record_segment}/{activity_segment}/` creates,
//! `PUT` and `DELETE /{record_segment}/{activity_segment}/{id}` update and delete. The record
//! segment in the path does not constrain the parent: the parent id decides.

use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, only_keys, scalar_text};
use super::output::Out;
use super::{Ctx, Reply};
use crate::limits;
use crate::model::activity::ActivityType;
use crate::model::{FieldValues, Kind, Upload};
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
    let mut fields = data_fields(kind, body.get("data"))?;
    if kind.is_dated_action() && ActivityType::completed(&fields) {
        return Err(ApiError::invalid_value(
            "completed",
            format!("a new {} cannot be created completed", kind.segment()),
        ));
    }
    let upload = take_upload(ctx, kind, &mut fields)?;
    for required in kind.required_fields() {
        if fields.get(*required).is_none_or(|v| v.is_empty()) {
            return Err(ApiError::invalid_value(required, "is required"));
        }
    }
    let place = place_of(&p)?;
    let mut stored: FieldValues =
        fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect();
    if kind.is_dated_action() {
        // A new task or follow-up is open: completed = 0 (the interface's state table).
        stored.entry("completed".to_string()).or_insert_with(|| "0".to_string());
    }
    let created =
        ctx.app.store.create_activity(&ctx.viewer, NewActivity { kind, parent, fields: stored, place, upload })?;
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
    let mut fields = data_fields(kind, body.get("data"))?;
    let upload = take_upload(ctx, kind, &mut fields)?;
    // A required field stays (an attachment without its file), and a stored file keeps a
    // name: `file` given alone renames it.
    for required in kind.required_fields().iter().chain(kind.holds_file().then_some(&"file")) {
        if fields.get(*required).is_some_and(|v| v.is_empty()) {
            return Err(ApiError::invalid_value(required, "cannot be emptied"));
        }
    }
    let changes = ActivityChanges { fields, place: place_of(&p)?, parent, upload };
    ctx.app.store.update_activity(&ctx.viewer, kind, id, changes)?;
    Ok(Reply::ok(Out::map()))
}

/// `POST /{segment}/{activity}/{id}/restore`: brings back a deleted activity (an extension).
pub fn restore(ctx: &Ctx<'_>, kind: ActivityType, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.restore_activity(&ctx.viewer, kind, id)?;
    Ok(Reply::ok(Out::map()))
}

pub fn delete(ctx: &Ctx<'_>, kind: ActivityType, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.delete_activity(&ctx.viewer, kind, id)?;
    Ok(Reply::ok(Out::map()))
}

/// `GET /{segment}/{activity}/{id}/file`: the stored file, as it was uploaded.
pub fn download(ctx: &Ctx<'_>, kind: ActivityType, id: i64) -> Result<super::Download, ApiError> {
    if !kind.holds_file() {
        return Err(ApiError::no_such_path(&format!("{}/{id}/file", kind.segment())));
    }
    let file = ctx.app.store.activity_file(&ctx.viewer, kind, id)?;
    Ok(super::Download { name: file.info.name, content_type: file.info.content_type, content: file.content })
}

/// The uploaded file of the request, for types that hold one: it names the `file` field
/// unless the body gave a name. Other types take no file.
fn take_upload(ctx: &Ctx<'_>, kind: ActivityType, fields: &mut FieldValues) -> Result<Option<Upload>, ApiError> {
    let mut files = ctx.uploads.iter().filter(|(key, _)| key == "data[file]" || key == "file");
    let Some((_, upload)) = files.next() else {
        if let Some((key, _)) = ctx.uploads.first() {
            return Err(ApiError::invalid_value(key, "only data[file] carries a file"));
        }
        return Ok(None);
    };
    if files.next().is_some() {
        return Err(ApiError::invalid_value("file", "one file per activity"));
    }
    if !kind.holds_file() {
        return Err(ApiError::invalid_value("file", format!("a {} takes no file", kind.segment())));
    }
    let name = Kind::Text
        .normalize(&upload.name)
        .ok()
        .filter(|n| !n.is_empty() && n.len() <= limits::NAME_BYTES_MAX)
        .ok_or_else(|| ApiError::invalid_value("file", "the file name must be 1 to 255 bytes of text"))?;
    // The body's `file`, if it gives one, names the file (as Show and the download say).
    let name = match fields.get("file").filter(|n| !n.is_empty()) {
        Some(given) => given.clone(),
        None => {
            fields.insert("file".into(), name.clone());
            name
        }
    };
    Ok(Some(Upload { name, content_type: upload.content_type.clone(), bytes: upload.bytes.clone() }))
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
