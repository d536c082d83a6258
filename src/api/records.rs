//! Record endpoints: list, create, show, update, delete; category tags; fields; ownership.

use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, id_list, ids_under, name_list, only_keys, scalar_text};
use super::output::Out;
use super::{Ctx, Reply};
use crate::limits;
use crate::model::CustomField;
use crate::model::activity::ActivityType;
use crate::model::{self, FieldDef, PrincipalKind, RecordType};
use crate::store::{
    ActivityRow, CategoryRef, Filter, ListEntry, ListQuery, NewRecord, RecordChanges, RecordDetail, RecordRow,
    RelatedItem, Search, SearchMode, SortField,
};
use crate::timefmt;

// ---------------------------------------------------------------------------------------------
// Output shapes

fn opt_iso(t: Option<i64>) -> Out {
    t.map_or_else(|| Out::text(""), Out::Time)
}

fn category_out(c: CategoryRef) -> Out {
    Out::map().with("id", Out::Int(c.id)).with("name", Out::text(c.name))
}

fn related_out(r: RelatedItem) -> Out {
    Out::map()
        .with("id", Out::Int(r.id))
        .with("typeid", Out::Int(r.typeid))
        .with("name", Out::text(r.name))
        .with("note", Out::text(r.note))
}

/// The `<fields>` of a record: every field of its type (empty when unset), then the audit fields.
/// The record's strings move into the document (a show clones none of them).
fn record_fields_out(custom: &[CustomField], r: &mut RecordRow) -> Out {
    let defs = model::fields_of(r.record_type, custom);
    let mut fields = Out::map_with_capacity(defs.len() + 6);
    for def in defs {
        let name = def.key();
        let value = r.fields.remove(name.as_ref()).unwrap_or_default();
        fields.push(name, Out::Text(value));
    }
    fields.push("creatorid", Out::IntText(r.creator_id));
    fields.push("creatorname", Out::Text(std::mem::take(&mut r.creator_name)));
    fields.push("creatordate", Out::IntText(r.created));
    fields.push("modificatorid", Out::IntText(r.modificator_id));
    fields.push("modificatorname", Out::Text(std::mem::take(&mut r.modificator_name)));
    fields.push("modificatordate", Out::IntText(r.updated));
    fields
}

pub(super) fn item_out(custom: &[CustomField], mut r: RecordRow) -> Out {
    let fields = record_fields_out(custom, &mut r);
    Out::map_with_capacity(9)
        .with("id", Out::Int(r.id))
        .with("name", Out::Text(r.name))
        .with("typeid", Out::Int(r.record_type.typeid()))
        .with("created", Out::Time(r.created))
        .with("viewed", opt_iso(r.viewed))
        .with("updated", Out::Time(r.updated))
        .with("ownership", Out::Int(r.ownership))
        .with("flagged", Out::flag(r.flagged))
        .with("fields", fields)
}

pub(super) fn activity_out(rt: RecordType, a: &ActivityRow) -> Out {
    // Every field of the type in the table's order (empty when unset).
    let mut fields = Out::map();
    match ActivityType::from_typeid(a.typeid) {
        Some(kind) => {
            for f in kind.fields() {
                fields.push(f.name, Out::text(a.fields.get(f.name).cloned().unwrap_or_default()));
            }
        }
        None => {
            for (k, v) in &a.fields {
                fields.push(k.clone(), Out::text(v.clone()));
            }
        }
    }
    let mut out = Out::map_with_capacity(19)
        .with("id", Out::Int(a.id))
        .with("typeid", Out::Int(a.typeid))
        .with("name", Out::text(a.name.clone()))
        .with("cn", Out::text(a.name.clone()))
        .with("parent", Out::Int(a.parent))
        .with("level", Out::Int(a.level))
        .with("position", Out::Int(a.position))
        .with("flagged", Out::flag(a.flagged))
        .with("created", Out::Time(a.created))
        .with("viewed", opt_iso(a.viewed))
        .with("updated", Out::Time(a.updated))
        .with("creatorid", Out::Int(a.creator_id))
        .with("creatorname", Out::text(a.creator_name.clone()))
        .with("modificatorid", Out::Int(a.modificator_id))
        .with("modificatorname", Out::text(a.modificator_name.clone()))
        .with("fields", fields);
    if let (Some(file), Some(kind)) = (&a.file, ActivityType::from_typeid(a.typeid)) {
        // Where to download the stored file, and what it is.
        out.push("filesize", Out::Int(file.size));
        out.push("filetype", Out::text(file.content_type.clone()));
        out.push("download", Out::text(format!("/{}/{}/{}/file", rt.segment(), kind.segment(), a.id)));
    }
    out
}

/// What Show returns (also the body of a create's 201): item, activities, categories,
/// related items.
fn show_doc(ctx: &Ctx<'_>, rt: RecordType, id: i64, viewed_now: Option<i64>) -> Result<Out, ApiError> {
    let mut detail = ctx.app.store.show_record(&ctx.viewer, rt, id)?;
    if let Some(now) = viewed_now {
        detail.record.viewed = Some(now);
    }
    Ok(detail_out(&ctx.app.config.fields, detail))
}

/// A record with its activities, categories and related items, as Show (and a webhook) gives it.
pub(super) fn detail_out(custom: &[CustomField], detail: RecordDetail) -> Out {
    let rt = detail.record.record_type;
    let mut activities = Out::map();
    for a in &detail.activities {
        activities.push_keyed(a.id, activity_out(rt, a));
    }
    Out::map_with_capacity(4)
        .with("item", item_out(custom, detail.record))
        .with("activities", activities)
        .with("categories", Out::list("category", detail.categories.into_iter().map(category_out).collect()))
        .with("relateditems", Out::list("relatedto", detail.related.into_iter().map(related_out).collect()))
}

// ---------------------------------------------------------------------------------------------
// Show, create, update, delete

pub fn show(ctx: &Ctx<'_>, rt: RecordType, id: i64) -> Result<Reply, ApiError> {
    let doc = show_doc(ctx, rt, id, Some(ctx.now))?;
    ctx.app.store.note_viewed(id, ctx.now);
    Ok(Reply::ok(doc))
}

pub fn create(ctx: &Ctx<'_>, rt: RecordType) -> Result<Reply, ApiError> {
    let input = record_input(ctx, rt, &ctx.body)?;
    let new = NewRecord {
        record_type: rt,
        fields: input.fields.into_iter().filter(|(_, v)| !v.is_empty()).collect(),
        ownership: input.ownership,
        flagged: input.flagged.unwrap_or(false),
        categories_add: input.categories_add,
        related_add: input.related_add,
    };
    let detail = ctx.app.store.create_record_shown(&ctx.viewer, new)?;
    let id = detail.record.id;
    Ok(Reply::created(detail_out(&ctx.app.config.fields, detail), format!("/{}/{id}", rt.segment())))
}

pub fn update(ctx: &Ctx<'_>, rt: RecordType, id: i64) -> Result<Reply, ApiError> {
    let changes = record_input(ctx, rt, &ctx.body)?;
    ctx.app.store.update_record(&ctx.viewer, rt, id, changes)?;
    Ok(Reply::ok(Out::map()))
}

/// `POST /{segment}/{id}/restore`: brings back a deleted record (an extension).
pub fn restore(ctx: &Ctx<'_>, rt: RecordType, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.restore_record(&ctx.viewer, rt, id)?;
    Ok(Reply::ok(Out::map()))
}

pub fn delete(ctx: &Ctx<'_>, rt: RecordType, id: i64) -> Result<Reply, ApiError> {
    ctx.app.store.delete_record(&ctx.viewer, rt, id)?;
    Ok(Reply::ok(Out::map()))
}

/// Reads a create or update body: fields, `ownership`, `flagged`, `categories` (add, remove)
/// and `relateditems` (add, remove). Any other key is an unknown field.
fn record_input(ctx: &Ctx<'_>, rt: RecordType, body: &Value) -> Result<RecordChanges, ApiError> {
    if let Some((key, _)) = ctx.uploads.first() {
        return Err(ApiError::invalid_value(
            key,
            "records take no files; files belong to file, photo and attachment activities",
        ));
    }
    let mut changes = RecordChanges::default();
    let Value::Object(map) = body else {
        return Err(ApiError::invalid_request("the body must be an object"));
    };
    let params = Params::new(body);
    for (key, value) in map {
        match key.as_str() {
            "ownership" => {
                changes.ownership = params
                    .int("ownership")
                    .map_err(|_| ApiError::invalid_value("ownership", "must be a user or group id"))?;
            }
            "flagged" => {
                // Empty is how Show writes "not flagged" (`<flagged/>`, `""`): a client sending
                // back what it read, or its false as it saw it, unflags.
                let empty = match value {
                    Value::Null => true,
                    Value::String(t) => model::trim_blank(t).is_empty(),
                    _ => false,
                };
                changes.flagged = if empty {
                    Some(false)
                } else {
                    params.flag("flagged").map_err(|_| ApiError::invalid_value("flagged", "must be 0 or 1"))?
                };
            }
            "categories" => {
                let (add, remove) = add_remove(value, "categories")?;
                changes.categories_add = ids_under(add, "categories")?;
                changes.categories_remove = ids_under(remove, "categories")?;
            }
            "relateditems" => {
                let (add, remove) = add_remove(value, "relateditems")?;
                changes.related_add = related_entries(add)?;
                changes.related_remove = ids_under(remove, "relateditems")?;
            }
            // Read-only: Show writes them among the fields, and a client sending back what it
            // read (an edit form) sends them too. They are left as they are.
            name if AUDIT_FIELDS.contains(&name) => {}
            name => {
                let def =
                    model::field_of(rt, &ctx.app.config.fields, name).ok_or_else(|| ApiError::incorrect_field(name))?;
                let text = match value {
                    Value::Null => String::new(),
                    other => {
                        scalar_text(other).ok_or_else(|| ApiError::invalid_value(name, "must be a single value"))?
                    }
                };
                let normalized = def.normalize(&text).map_err(|m| ApiError::invalid_value(name, m))?;
                changes.fields.insert(def.name(), normalized);
            }
        }
    }
    Ok(changes)
}

/// The audit fields Show writes inside `fields`.
const AUDIT_FIELDS: [&str; 6] =
    ["creatorid", "creatorname", "creatordate", "modificatorid", "modificatorname", "modificatordate"];

static NOTHING: Value = Value::Null;

/// The `add` and `remove` parts of a `categories` or `relateditems` element.
fn add_remove<'v>(value: &'v Value, what: &str) -> Result<(&'v Value, &'v Value), ApiError> {
    match value {
        Value::Object(m) => {
            if let Some(other) = m.keys().find(|k| *k != "add" && *k != "remove") {
                return Err(ApiError::invalid_value(what, format!("holds add and remove, not {other}")));
            }
            Ok((m.get("add").unwrap_or(&NOTHING), m.get("remove").unwrap_or(&NOTHING)))
        }
        Value::String(s) if s.is_empty() => Ok((&NOTHING, &NOTHING)),
        _ => Err(ApiError::invalid_value(what, "must hold add and/or remove")),
    }
}

/// Related items to add: `<relatedto><id>5</id><note>..</note></relatedto>` in any of the
/// encodings, or bare ids.
fn related_entries(value: &Value) -> Result<Vec<(i64, String)>, ApiError> {
    fn walk(v: &Value, out: &mut Vec<(i64, String)>) -> Result<(), ApiError> {
        match v {
            Value::Null => Ok(()),
            Value::Array(items) => items.iter().try_for_each(|i| walk(i, out)),
            Value::Object(m) if m.contains_key("id") => {
                let id = ids_under(&m["id"], "relateditems")?;
                let [id] = id.as_slice() else {
                    return Err(ApiError::invalid_value("relateditems", "each relatedto needs one id"));
                };
                let note = match m.get("note") {
                    None | Some(Value::Null) => String::new(),
                    Some(n) => {
                        scalar_text(n).ok_or_else(|| ApiError::invalid_value("relateditems", "a note is text"))?
                    }
                };
                model::check_text(&note).map_err(|e| ApiError::invalid_value("relateditems", format!("note {e}")))?;
                out.push((*id, note.trim().to_string()));
                Ok(())
            }
            Value::Object(m) => m.values().try_for_each(|i| walk(i, out)),
            scalar => {
                for id in ids_under(scalar, "relateditems")? {
                    out.push((id, String::new()));
                }
                Ok(())
            }
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out)?;
    if out.len() > limits::REFERENCES_PER_REQUEST_MAX {
        return Err(ApiError::invalid_value("relateditems", "too many in one request"));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// List

/// What a list entry shows.
struct Layout {
    /// Field names to flatten into each entry.
    fields: Vec<String>,
    categories: bool,
}

pub fn list(ctx: &Ctx<'_>, rt: RecordType) -> Result<Reply, ApiError> {
    let params = ctx.params();
    let p = Params::new(&params);
    let (query, layout) = list_query(ctx, rt, &p)?;
    let (entries, count) = ctx.app.store.list_records(&ctx.viewer, &query)?;
    let mut doc = Out::map();
    for e in &entries {
        doc.push_keyed(e.record.id, entry_out(e, &layout));
    }
    doc.push("count", Out::Int(i64::try_from(count).unwrap_or(i64::MAX)));
    Ok(Reply::ok(doc))
}

/// Entry keys a flattened field must not overwrite (a company's `name` field is its name).
const ENTRY_KEYS: &[&str] =
    &["id", "name", "parentid", "flagged", "company", "created", "viewed", "updated", "categories"];

fn entry_out(e: &ListEntry, layout: &Layout) -> Out {
    let r = &e.record;
    let mut out = Out::map()
        .with("id", Out::Int(r.id))
        .with("name", Out::text(r.name.clone()))
        .with("parentid", Out::Int(e.parent_id))
        .with("flagged", Out::flag(r.flagged));
    for name in &layout.fields {
        if ENTRY_KEYS.contains(&name.as_str()) {
            continue;
        }
        out.push(name.clone(), Out::text(r.fields.get(name).cloned().unwrap_or_default()));
    }
    out.push("company", Out::text(e.company.clone()));
    out.push("created", Out::Time(r.created));
    out.push("viewed", opt_iso(r.viewed));
    out.push("updated", Out::Time(r.updated));
    if layout.categories {
        out.push("categories", Out::list("category", e.categories.iter().cloned().map(category_out).collect()));
    }
    out
}

fn list_query(ctx: &Ctx<'_>, rt: RecordType, p: &Params<'_>) -> Result<(ListQuery, Layout), ApiError> {
    let custom = &ctx.app.config.fields;
    let all_fields = model::fields_of(rt, custom);

    // layout, fields (alias fieldlist), categories
    let full = p.flag("layout")?.unwrap_or(false);
    let wanted = match (p.get("fields"), p.get("fieldlist")) {
        (Some(v), _) | (None, Some(v)) => Some(name_list(v, "fields")?),
        (None, None) => None,
    };
    // Checked with any layout (a wrong name is an error, not silently ignored); a name given
    // twice is listed once.
    let wanted = match wanted {
        Some(names) => {
            let mut unique: Vec<String> = Vec::with_capacity(names.len());
            for n in names {
                if model::field_of(rt, custom, &n).is_none() {
                    return Err(ApiError::incorrect_field(&n));
                }
                if !unique.contains(&n) {
                    unique.push(n);
                }
            }
            Some(unique)
        }
        None => None,
    };
    let fields: Vec<String> = if full {
        match wanted {
            Some(names) if !names.is_empty() => names,
            _ => all_fields.iter().map(FieldDef::name).collect(),
        }
    } else {
        rt.summary_fields().iter().map(|s| s.to_string()).collect()
    };
    // Checked with any layout, so that a wrong value is an error rather than silently ignored.
    let with_categories = p.flag("categories")?.unwrap_or(false) && full;

    // paging
    let limit =
        p.page_size("limit", 0, i64::from(limits::LIST_LIMIT_MAX), i64::from(limits::LIST_LIMIT_DEFAULT))? as u32;
    // `offset`, as reports call it, is `start` here too (a client paging a list as it pages a
    // report would otherwise get the first page for ever); `start` wins when both are given.
    let key = if p.get("start").is_none() && p.get("offset").is_some() { "offset" } else { "start" };
    let start = match p.int(key)? {
        None => 0,
        Some(n) if n >= 0 => n as u64,
        Some(n) => {
            return Err(ApiError::invalid_parameter(key, format!("{n} is negative")));
        }
    };

    // sorting
    let sort = match p.nonempty("sortfield")?.as_deref() {
        None | Some("name") => SortField::Name,
        Some("created") => SortField::Created,
        Some("flagged") => SortField::Flagged,
        Some("update_time") => SortField::Updated,
        Some(other) => {
            return Err(ApiError::invalid_parameter(
                "sortfield",
                format!("{other:?} is not one of name, created, flagged, update_time"),
            ));
        }
    };
    let descending = match p.nonempty("sortdir")?.map(|s| s.to_ascii_uppercase()).as_deref() {
        None | Some("ASC") => false,
        Some("DESC") => true,
        Some(other) => {
            return Err(ApiError::invalid_parameter("sortdir", format!("{other:?} is not ASC or DESC")));
        }
    };

    let filter = filter_of(ctx, rt, p)?;
    let search = search_of(rt, custom, p)?;
    Ok((
        ListQuery { record_type: rt, filter, search, sort, descending, limit, start, with_categories },
        Layout { fields, categories: with_categories },
    ))
}

const FILTERMODES: &str = "flagged, assigned, nocategory, viewed, created, updated, updatedafter, notviewed, \
     notupdated, duetoday, duesoon, tasksoverdue, owner, category, archived, unsent, byphone, byemail";

fn filter_of(ctx: &Ctx<'_>, rt: RecordType, p: &Params<'_>) -> Result<Filter, ApiError> {
    let mode = p.nonempty("filtermode")?.map(|s| s.to_ascii_lowercase());
    let raw_value = p.get("filtervalue").filter(|v| !matches!(v, Value::Null));
    let value = match raw_value {
        Some(Value::Array(_)) | None => None,
        Some(_) => p.nonempty("filtervalue")?,
    };
    // As sent, blanks included (the description's `maxLength`): all blanks is no value, but
    // not an unbounded one.
    if p.sent_bytes("filtervalue") > limits::SEARCH_VALUE_BYTES_MAX {
        return Err(ApiError::invalid_parameter("filtervalue", "is too long"));
    }
    let special = p.nonempty("special")?.map(|s| s.to_ascii_uppercase());
    if let Some(s) = &special
        && s != "AND"
        && s != "OR"
    {
        return Err(ApiError::invalid_parameter("special", format!("{s:?} is not AND or OR")));
    }
    // `special` says how categories combine; with another filter (or none) it says nothing,
    // and clients that send every parameter at its default send it.
    let days = |default: u32| -> Result<i64, ApiError> {
        let n = match &value {
            None => default,
            Some(v) => {
                v.parse::<u32>().ok().filter(|n| (1..=limits::LIST_FILTER_DAYS_MAX).contains(n)).ok_or_else(|| {
                    ApiError::invalid_parameter(
                        "filtervalue",
                        format!("{v:?} is not a number of days from 1 to {}", limits::LIST_FILTER_DAYS_MAX),
                    )
                })?
            }
        };
        Ok(i64::from(n))
    };
    let since = |default: u32| -> Result<i64, ApiError> { Ok(ctx.now - days(default)? * 86_400) };
    let required = |what: &str| -> Result<String, ApiError> {
        value.clone().ok_or_else(|| ApiError::invalid_parameter("filtervalue", format!("is required: {what}")))
    };
    let today = timefmt::today(&ctx.app.config.site.timezone);
    let fields_where = |pred: &dyn Fn(&FieldDef<'_>) -> bool| -> Vec<String> {
        model::fields_of(rt, &ctx.app.config.fields).iter().filter(|d| pred(d)).map(FieldDef::name).collect()
    };

    Ok(match mode.as_deref() {
        None => {
            if value.is_some() {
                return Err(ApiError::invalid_parameter("filtervalue", "needs a filtermode"));
            }
            Filter::None
        }
        Some("flagged") => Filter::Flagged,
        // Sent empty: as left out, the caller and the caller's groups.
        Some("assigned") => match raw_value.map(|v| id_list(v, "filtervalue")).transpose()? {
            Some(ids) if !ids.is_empty() => Filter::Assigned(ids),
            _ => Filter::Assigned(ctx.viewer.owner_ids()),
        },
        Some("nocategory") => Filter::NoCategory,
        Some("viewed") => Filter::ViewedSince(since(limits::LIST_FILTER_DAYS_DEFAULT)?),
        Some("notviewed") => Filter::NotViewedSince(since(limits::LIST_FILTER_DAYS_DEFAULT)?),
        Some("created") => Filter::CreatedSince(since(limits::LIST_FILTER_DAYS_DEFAULT)?),
        Some("updated") => Filter::UpdatedSince(since(limits::LIST_FILTER_DAYS_DEFAULT)?),
        Some("notupdated") => Filter::NotUpdatedSince(since(limits::LIST_FILTER_DAYS_DEFAULT)?),
        Some("updatedafter") => {
            let v = required("a date or date and time")?;
            let t = timefmt::parse_datetime(&v).ok_or_else(|| {
                ApiError::invalid_parameter("filtervalue", format!("{v:?} is not a date or date and time"))
            })?;
            Filter::UpdatedAfter(t)
        }
        Some("duetoday") => Filter::DueBetween(today.to_string(), today.to_string()),
        Some("duesoon") => {
            let d = days(limits::LIST_DUESOON_DAYS_DEFAULT)?;
            let until = today.checked_add(jiff::Span::new().days(d)).unwrap_or(today);
            Filter::DueBetween(today.to_string(), until.to_string())
        }
        Some("tasksoverdue") => Filter::DueBefore(today.to_string()),
        Some("owner") => match &value {
            Some(v) => Filter::Owner(
                v.parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ApiError::invalid_parameter("filtervalue", format!("{v:?} is not an id")))?,
            ),
            None => Filter::Owner(ctx.viewer.user_id),
        },
        Some("category") => {
            let Some(v) = raw_value else {
                return Err(ApiError::invalid_parameter("filtervalue", "is required: category tag ids"));
            };
            let ids = id_list(v, "filtervalue")?;
            if ids.is_empty() {
                return Err(ApiError::invalid_parameter("filtervalue", "is required: category tag ids"));
            }
            Filter::Category { ids, all: special.as_deref() == Some("AND") }
        }
        Some("archived") => Filter::Archived,
        Some("unsent") => Filter::Unsent { email_fields: fields_where(&|d| d.is_email()) },
        Some("byphone") => {
            let v = required("a phone number")?;
            let digits: String = v.chars().filter(char::is_ascii_digit).collect();
            if digits.len() < limits::LIST_BYPHONE_DIGITS_MIN {
                return Err(ApiError::invalid_parameter(
                    "filtervalue",
                    format!("a phone number needs at least {} digits", limits::LIST_BYPHONE_DIGITS_MIN),
                ));
            }
            Filter::ByPhone { digits, fields: fields_where(&|d| d.is_phone()) }
        }
        Some("byemail") => {
            Filter::ByEmail { address: required("an e-mail address")?, fields: fields_where(&|d| d.is_email()) }
        }
        Some(other) => {
            return Err(ApiError::invalid_parameter("filtermode", format!("{other:?} is not one of {FILTERMODES}")));
        }
    })
}

fn search_of(rt: RecordType, custom: &[model::CustomField], p: &Params<'_>) -> Result<Option<Search>, ApiError> {
    let value = p.text("searchvalue")?.unwrap_or_default();
    if p.sent_bytes("searchvalue") > limits::SEARCH_VALUE_BYTES_MAX {
        return Err(ApiError::invalid_parameter("searchvalue", "is too long"));
    }
    let mode_text = match p.nonempty("searchmode")? {
        Some(m) => m,
        None if value.is_empty() => return Ok(None),
        None => "Sany".to_string(),
    };
    let bad = || {
        ApiError::invalid_parameter(
            "searchmode",
            format!(
                "{mode_text:?} is not one of Sany, Cany, Sanyitem, Canyitem, Sanyjournal, Canyjournal, \
                 or S, C, E, N followed by a field id or name"
            ),
        )
    };
    let mut chars = mode_text.chars();
    let mode = match chars.next().map(|c| c.to_ascii_uppercase()) {
        Some('S') => SearchMode::StartsWith,
        Some('C') => SearchMode::Contains,
        Some('E') => SearchMode::Empty,
        Some('N') => SearchMode::NotEmpty,
        _ => return Err(bad()),
    };
    let target = chars.as_str();
    let needs_value = matches!(mode, SearchMode::StartsWith | SearchMode::Contains);
    if needs_value && value.is_empty() {
        return Err(ApiError::invalid_parameter("searchvalue", format!("is required with searchmode {mode_text}")));
    }
    let any = |s: Search| -> Result<Option<Search>, ApiError> { if needs_value { Ok(Some(s)) } else { Err(bad()) } };
    match target.to_ascii_lowercase().as_str() {
        "any" => any(Search::Any { mode, value }),
        "anyitem" => any(Search::AnyItem { mode, value }),
        "anyjournal" => any(Search::AnyJournal { mode, value }),
        "" => Err(bad()),
        field => {
            let def = match field.parse::<i64>() {
                Ok(id) => model::field_by_id(rt, custom, id),
                Err(_) => model::field_of(rt, custom, field),
            };
            let def = def.ok_or_else(|| ApiError::incorrect_field(target))?;
            Ok(Some(Search::Field { name: def.name(), mode, value }))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Category tags, fields, ownership

pub fn list_categories(ctx: &Ctx<'_>, rt: RecordType) -> Result<Reply, ApiError> {
    let cats = ctx.app.store.list_categories(&ctx.viewer, rt)?;
    Ok(Reply::ok(Out::map().with("categories", Out::list("category", cats.into_iter().map(category_out).collect()))))
}

pub fn create_category(ctx: &Ctx<'_>, rt: RecordType) -> Result<Reply, ApiError> {
    let p = Params::new(&ctx.body);
    only_keys(&ctx.body, &["name"])?;
    let name = p
        .nonempty("name")
        .map_err(|_| ApiError::invalid_value("name", "must be text"))?
        .ok_or_else(|| ApiError::invalid_value("name", "is required"))?;
    if p.sent_bytes("name") > limits::NAME_BYTES_MAX {
        return Err(ApiError::invalid_value("name", format!("is longer than {} bytes", limits::NAME_BYTES_MAX)));
    }
    model::check_text(&name).map_err(|e| ApiError::invalid_value("name", e))?;
    let id = ctx.app.store.create_category(&ctx.viewer, rt, &name)?;
    Ok(Reply { status: 201, doc: Out::map().with("id", Out::Int(id)), location: None })
}

pub fn list_fields(ctx: &Ctx<'_>, rt: RecordType) -> Result<Reply, ApiError> {
    let fields = model::fields_of(rt, &ctx.app.config.fields)
        .iter()
        .map(|d| {
            Out::map()
                .with("id", Out::Int(d.id(rt)))
                .with("name", Out::text(d.name()))
                .with("label", Out::text(d.label()))
                .with("type", Out::text(d.type_name()))
                .with("options", Out::list("option", d.options().into_iter().map(Out::Text).collect()))
                .with("categories", Out::list("category", Vec::new()))
        })
        .collect();
    Ok(Reply::ok(Out::map().with("fields", Out::list("field", fields))))
}

pub fn ownership(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let params = ctx.params();
    let include_deleted = Params::new(&params).flag("deleted")?.unwrap_or(false);
    let all = ctx.app.store.ownership(&ctx.viewer.org, include_deleted)?;
    let flag01 = |b: bool| Out::Int(i64::from(b));
    let users = all
        .iter()
        .filter(|p| p.kind == PrincipalKind::User)
        .map(|u| {
            Out::map()
                .with("id", Out::Int(u.id))
                .with("name", Out::text(u.name.clone()))
                .with("email", Out::text(u.email.clone()))
                .with("preventlogin", flag01(u.prevent_login))
                .with("preventprivatedata", flag01(u.prevent_private))
                .with("administrator", flag01(u.admin))
                .with("deleted", flag01(u.deleted))
        })
        .collect();
    let groups = all
        .iter()
        .filter(|p| p.kind == PrincipalKind::Group)
        .map(|g| {
            Out::map()
                .with("id", Out::Int(g.id))
                .with("name", Out::text(g.name.clone()))
                .with("email", Out::text(g.email.clone()))
                .with("deleted", flag01(g.deleted))
        })
        .collect();
    Ok(Reply::ok(Out::map().with("users", Out::list("user", users)).with("groups", Out::list("group", groups))))
}
