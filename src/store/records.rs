//! Records (contacts, companies, project blogs, tickets): create, update, soft delete, show,
//! list with filters and searches; their category tags and related items.

use std::collections::HashMap;
use std::sync::OnceLock;

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, ToSql};

use super::ExecCached;
use super::activities::FileInfo;
use super::hooks::Target;
use super::principals::{owner_ids_json, principal_kind};
use super::{
    FIELD_KEY_CHARS, Result, SEARCH_SEPARATOR, Store, StoreError, answer_fields, field_key, fields_json, index_fields,
    json_ids, merge_fields, search_text,
};
use crate::model::hook::Event;
use crate::model::{FieldValues, PrincipalKind, RecordType, Viewer};
use crate::timefmt::now_secs;

/// A record as Show and List return it.
#[derive(Clone, Debug)]
pub struct RecordRow {
    pub id: i64,
    pub record_type: RecordType,
    pub name: String,
    pub fields: FieldValues,
    pub ownership: i64,
    pub flagged: bool,
    pub created: i64,
    pub updated: i64,
    pub viewed: Option<i64>,
    pub creator_id: i64,
    pub creator_name: String,
    pub modificator_id: i64,
    pub modificator_name: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CategoryRef {
    pub id: i64,
    pub name: String,
}

#[derive(Clone, Debug)]
pub struct RelatedItem {
    pub id: i64,
    pub typeid: i64,
    pub name: String,
    pub note: String,
}

/// An activity under a record, as Show lists it.
#[derive(Clone, Debug)]
pub struct ActivityRow {
    pub id: i64,
    pub typeid: i64,
    pub parent: i64,
    pub level: i64,
    pub position: i64,
    pub name: String,
    pub fields: FieldValues,
    pub flagged: bool,
    pub created: i64,
    pub updated: i64,
    pub viewed: Option<i64>,
    pub creator_id: i64,
    pub creator_name: String,
    pub modificator_id: i64,
    pub modificator_name: String,
    /// The stored file of a file, photo or attachment activity.
    pub file: Option<FileInfo>,
}

#[derive(Clone, Debug)]
pub struct RecordDetail {
    pub record: RecordRow,
    pub activities: Vec<ActivityRow>,
    pub categories: Vec<CategoryRef>,
    pub related: Vec<RelatedItem>,
}

pub struct NewRecord {
    pub record_type: RecordType,
    pub fields: FieldValues,
    /// `None`: the creating user.
    pub ownership: Option<i64>,
    pub flagged: bool,
    pub categories_add: Vec<i64>,
    pub related_add: Vec<(i64, String)>,
}

#[derive(Default)]
pub struct RecordChanges {
    /// Fields to set; an empty value clears the field.
    pub fields: FieldValues,
    pub ownership: Option<i64>,
    pub flagged: Option<bool>,
    pub categories_add: Vec<i64>,
    pub categories_remove: Vec<i64>,
    pub related_add: Vec<(i64, String)>,
    pub related_remove: Vec<i64>,
}

/// The primary filter of a list (`filtermode`), resolved to values.
#[derive(Clone, Debug)]
pub enum Filter {
    None,
    Flagged,
    Assigned(Vec<i64>),
    NoCategory,
    ViewedSince(i64),
    NotViewedSince(i64),
    CreatedSince(i64),
    UpdatedSince(i64),
    NotUpdatedSince(i64),
    UpdatedAfter(i64),
    /// Open, dated tasks and follow-ups due from the first date through the second (YYYY-MM-DD).
    DueBetween(String, String),
    /// Open, dated tasks and follow-ups due before the date.
    DueBefore(String),
    Owner(i64),
    Category {
        ids: Vec<i64>,
        all: bool,
    },
    Archived,
    /// Has an address in one of `email_fields` and no e-mail activity (linked or scheduled e-mails).
    Unsent {
        email_fields: Vec<String>,
    },
    /// The digits of one of `fields` end with `digits`.
    ByPhone {
        digits: String,
        fields: Vec<String>,
    },
    /// One of `fields` equals the address, ignoring ASCII case.
    ByEmail {
        address: String,
        fields: Vec<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchMode {
    StartsWith,
    Contains,
    Empty,
    NotEmpty,
}

/// The secondary search of a list (`searchmode` + `searchvalue`).
#[derive(Clone, Debug)]
pub enum Search {
    /// The record's name and fields, and the titles and fields of its activities.
    Any { mode: SearchMode, value: String },
    /// The record's name and fields only.
    AnyItem { mode: SearchMode, value: String },
    /// The titles and fields of the record's activities only.
    AnyJournal { mode: SearchMode, value: String },
    /// One field.
    Field { name: String, mode: SearchMode, value: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortField {
    Name,
    Created,
    Flagged,
    Updated,
}

#[derive(Clone, Debug)]
pub struct ListQuery {
    pub record_type: RecordType,
    pub filter: Filter,
    pub search: Option<Search>,
    pub sort: SortField,
    pub descending: bool,
    pub limit: u32,
    pub start: u64,
    pub with_categories: bool,
}

pub struct ListEntry {
    pub record: RecordRow,
    /// Names of related companies, comma-joined.
    pub company: String,
    /// The first related company's id, 0 when none.
    pub parent_id: i64,
    pub categories: Vec<CategoryRef>,
}

/// Typeids of the activities that are e-mail activity for `unsent`: linked e-mails, scheduled e-mail.
const EMAIL_ACTIVITY_TYPEIDS: &str = "(90, 88)";
/// Typeid of companies, for the `company` column.
const COMPANY_TYPEID: i64 = 40;

/// What a change made at `now` (seconds) stamps `updated` with: now, or the newest `updated`
/// of any record or activity when that is later (the clock was set back after it was
/// stamped), so that a client syncing with `updatedafter` (at or after) from the newest it
/// saw misses no change. Schema 19's triggers keep that newest.
pub(super) fn updated_stamp(tx: &Connection, now: i64) -> Result<i64> {
    Ok(tx.prepare_cached("SELECT max(?1, v) FROM updated_high WHERE id = 1")?.query_row([now], |r| r.get(0))?)
}

pub(super) const RECORD_COLUMNS: &str = "i.id, i.typeid, i.name, i.fields, i.ownership, i.flagged, i.created, i.updated, \
     i.viewed, i.creator, coalesce(cu.name, ''), i.modificator, coalesce(mu.name, '')";
/// How many columns `RECORD_COLUMNS` has.
const RECORD_COLUMN_COUNT: usize = 13;
pub(super) const AUDIT_JOINS: &str =
    "LEFT JOIN principals cu ON cu.id = i.creator LEFT JOIN principals mu ON mu.id = i.modificator";

pub(super) fn record_from_row(row: &Row<'_>) -> rusqlite::Result<RecordRow> {
    let typeid: i64 = row.get(1)?;
    Ok(RecordRow {
        id: row.get(0)?,
        record_type: RecordType::from_typeid(typeid).unwrap_or(RecordType::Contact),
        name: row.get(2)?,
        // Parsed where SQLite holds it, not copied into a string first.
        fields: match row.get_ref(3)? {
            ValueRef::Text(json) => answer_fields(std::str::from_utf8(json).unwrap_or_default())?,
            _ => FieldValues::new(),
        },
        ownership: row.get(4)?,
        flagged: row.get(5)?,
        created: row.get(6)?,
        updated: row.get(7)?,
        viewed: row.get(8)?,
        creator_id: row.get(9)?,
        creator_name: row.get(10)?,
        modificator_id: row.get(11)?,
        modificator_name: row.get(12)?,
    })
}

/// SQL that is true when the item aliased `alias` is visible to the viewer; binds `:owners`.
fn visible(viewer: &Viewer, alias: &str) -> String {
    if viewer.admin { "1".to_string() } else { format!("{alias}.ownership IN (SELECT value FROM json_each(:owners))") }
}

/// What an erase removed.
#[derive(Debug)]
pub struct Erased {
    /// Rows removed.
    pub rows: usize,
    /// Webhook deliveries about the record that were not sent yet: their receivers will not
    /// hear of those changes.
    pub unsent_deliveries: usize,
}

impl Store {
    #[cfg(test)]
    pub fn create_record(&self, viewer: &Viewer, new: NewRecord) -> Result<i64> {
        self.write_emitting(|tx| self.insert_record(tx, viewer, new))
    }

    /// Creates a record and reads it back as Show gives it, in the create's own transaction:
    /// another client's change or delete of the new record right after it is not in the answer
    /// (read afterwards, a create deleted meanwhile answered 404, and its client made another).
    pub fn create_record_shown(&self, viewer: &Viewer, new: NewRecord) -> Result<RecordDetail> {
        let record_type = new.record_type;
        self.write_emitting(|tx| {
            let (id, wrote) = self.insert_record(tx, viewer, new)?;
            Ok((detail_of(tx, viewer, record_type, id, State::Live)?, wrote))
        })
    }

    /// The new record's id, and whether a webhook delivery was queued.
    pub(super) fn insert_record(&self, tx: &Connection, viewer: &Viewer, new: NewRecord) -> Result<(i64, bool)> {
        let ownership = match new.ownership {
            Some(o) => o,
            // Without private records the default is the user's group, if they have one
            // only (an administrator's too); with several the caller must choose.
            None if viewer.prevent_private => match viewer.groups[..] {
                [group] => group,
                _ => {
                    return Err(StoreError::Forbidden(
                        "this user may not own private records: give one of their groups' ids as ownership".into(),
                    ));
                }
            },
            None => viewer.user_id,
        };
        check_ownership(tx, viewer, ownership)?;
        check_principal_fields(tx, viewer, &new.fields, None)?;
        let now = now_secs();
        let stamp = updated_stamp(tx, now)?;
        let name = new.record_type.display_name(&new.fields);
        tx.exec(
            "INSERT INTO items (org, typeid, ownership, name, fields, search, flagged, created, updated, creator,
                                modificator)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?10, ?9, ?9)",
            (
                &viewer.org,
                new.record_type.typeid(),
                ownership,
                &name,
                fields_json(&new.fields),
                search_text(&name, &new.fields),
                new.flagged,
                now,
                viewer.user_id,
                stamp,
            ),
        )?;
        let id = tx.last_insert_rowid();
        tx.exec("UPDATE items SET record_id = id WHERE id = ?1", [id])?;
        index_fields(tx, id, &FieldValues::new(), &new.fields)?;
        let (added, _) = change_categories(tx, viewer, new.record_type, id, &new.categories_add, &[])?;
        add_related(tx, viewer, id, &new.related_add)?;
        let mut events = vec![Event::ItemsCreate];
        if added > 0 {
            events.push(Event::ItemsCategorize);
        }
        let wrote = self.emit(tx, &viewer.org, &events, Target::Record(new.record_type, id))?;
        Ok((id, wrote))
    }

    pub fn update_record(
        &self,
        viewer: &Viewer,
        record_type: RecordType,
        id: i64,
        changes: RecordChanges,
    ) -> Result<()> {
        self.write_emitting(|tx| {
            let current = load_record(tx, viewer, record_type, id)?;
            let mut fields = current.fields.clone();
            merge_fields(&mut fields, &changes.fields);
            check_principal_fields(tx, viewer, &changes.fields, Some(&current.fields))?;
            let ownership = match changes.ownership {
                Some(o) if o != current.ownership => {
                    check_ownership(tx, viewer, o)?;
                    o
                }
                _ => current.ownership,
            };
            let flagged = changes.flagged.unwrap_or(current.flagged);
            let (added, removed) =
                change_categories(tx, viewer, record_type, id, &changes.categories_add, &changes.categories_remove)?;
            let mut related = add_related(tx, viewer, id, &changes.related_add)?;
            for target in &changes.related_remove {
                related += tx.exec("DELETE FROM relations WHERE item = ?1 AND related = ?2", (id, target))?;
            }
            // An update that changes nothing (a client saving what it read) leaves `updated`
            // where it was and tells no hook: clients syncing by either are not woken for it.
            let changed = fields != current.fields
                || ownership != current.ownership
                || flagged != current.flagged
                || added + removed + related > 0;
            if !changed {
                return Ok(((), false));
            }
            let name = record_type.display_name(&fields);
            // `updated` never goes back, here or where a record is deleted or restored: after
            // the wall clock is stepped back (NTP correcting a clock that ran ahead), a change
            // stamped before the newest one is lost to clients syncing by `updated`, and the
            // record would seem changed before it was created (`updated_stamp`).
            tx.exec(
                "UPDATE items SET name = ?2, fields = ?3, search = ?4, ownership = ?5, flagged = ?6,
                                  updated = CASE WHEN ?7 >= updated THEN ?7 ELSE updated + 1 END, modificator = ?8
                 WHERE id = ?1",
                (
                    id,
                    &name,
                    fields_json(&fields),
                    search_text(&name, &fields),
                    ownership,
                    flagged,
                    updated_stamp(tx, now_secs())?,
                    viewer.user_id,
                ),
            )?;
            index_fields(tx, id, &current.fields, &fields)?;
            let mut events = vec![Event::ItemsUpdate];
            if added > 0 {
                events.push(Event::ItemsCategorize);
            }
            if removed > 0 {
                events.push(Event::ItemsUncategorize);
            }
            let wrote = self.emit(tx, &viewer.org, &events, Target::Record(record_type, id))?;
            Ok(((), wrote))
        })
    }

    /// Archives the record and its activities together (soft delete).
    pub fn delete_record(&self, viewer: &Viewer, record_type: RecordType, id: i64) -> Result<()> {
        self.write_emitting(|tx| {
            load_record(tx, viewer, record_type, id)?;
            // The notification carries the record as it was, activities included.
            let wrote = self.emit(tx, &viewer.org, &[Event::ItemsDelete], Target::Record(record_type, id))?;
            let now = updated_stamp(tx, now_secs())?;
            // The record, then its activities (two statements: each uses its index).
            tx.exec(
                "UPDATE items SET archived = ?1, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3
                 WHERE id = ?1 AND archived IS NULL",
                (id, now, viewer.user_id),
            )?;
            tx.exec(
                "UPDATE items SET archived = ?1, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3
                 WHERE record_id = ?1 AND parent IS NOT NULL AND archived IS NULL",
                (id, now, viewer.user_id),
            )?;
            Ok(((), wrote))
        })
    }

    /// Brings back a deleted record with what its deletion archived (not what was deleted
    /// before, separately).
    pub fn restore_record(&self, viewer: &Viewer, record_type: RecordType, id: i64) -> Result<()> {
        self.write_emitting(|tx| {
            load_record_in(tx, viewer, record_type, id, State::Deleted)?;
            let now = updated_stamp(tx, now_secs())?;
            tx.exec(
                "UPDATE items SET archived = NULL, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3
                 WHERE id = ?1 AND archived = ?1",
                (id, now, viewer.user_id),
            )?;
            tx.exec(
                "UPDATE items SET archived = NULL, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3
                 WHERE record_id = ?1 AND parent IS NOT NULL AND archived = ?1",
                (id, now, viewer.user_id),
            )?;
            let wrote = self.emit(tx, &viewer.org, &[Event::ItemsRestore], Target::Record(record_type, id))?;
            Ok(((), wrote))
        })
    }

    /// Of the records `ids`, the live ones the viewer may see.
    pub fn visible_ids(&self, viewer: &Viewer, ids: &[i64]) -> Result<std::collections::HashSet<i64>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        self.read(|tx| visible_ids_in(tx, viewer, ids))
    }

    pub fn show_record(&self, viewer: &Viewer, record_type: RecordType, id: i64) -> Result<RecordDetail> {
        // Most records have no tags, related items or activities: then their one statement is
        // the whole show. Else all of it is read again in one transaction, for one snapshot.
        let (record, has) =
            self.read_one_statement(|c| load_record_with(c, viewer, record_type, id, State::Live, true))?;
        let mut detail = if has == [false; 3] {
            RecordDetail { record, activities: Vec::new(), categories: Vec::new(), related: Vec::new() }
        } else {
            self.read(|tx| detail_of(tx, viewer, record_type, id, State::Live))?
        };
        detail.record.viewed = self.viewed_overlay(id, detail.record.viewed);
        Ok(detail)
    }

    pub fn list_records(&self, viewer: &Viewer, q: &ListQuery) -> Result<(Vec<ListEntry>, u64)> {
        if matches!(q.filter, Filter::ViewedSince(_) | Filter::NotViewedSince(_)) {
            // These filters read the column: write the pending stamps first.
            self.flush_viewed()?;
        }
        if let Some(Search::Field { name, mode: SearchMode::StartsWith, value }) = &q.search
            && !value.is_empty()
        {
            self.index_field(name)?;
        }
        let (mut entries, count) = self.read(|tx| {
            let mut params: Vec<(&'static str, Value)> = Vec::new();
            if !viewer.admin {
                params.push((":owners", Value::Text(owner_ids_json(viewer))));
            }
            params.push((":org", Value::Text(viewer.org.clone())));
            params.push((":typeid", Value::Integer(q.record_type.typeid())));
            let mut conditions = vec![
                String::new(), // the organisation, below
                "i.typeid = :typeid".to_string(),
                "i.parent IS NULL".to_string(),
                visible(viewer, "i"),
            ];
            if matches!(q.filter, Filter::Archived) {
                conditions.push("i.archived IS NOT NULL".into());
            } else {
                conditions.push("i.archived IS NULL".into());
            }
            filter_sql(&q.filter, &mut conditions, &mut params);
            let indexed = match &q.search {
                Some(search) => search_sql(search, &mut conditions, &mut params),
                None => false,
            };
            // With a field search answered by `field_values`, the matching ids come from that
            // index; `+i.org` keeps SQLite from walking `items_records` instead and testing
            // every record of the type against the id list.
            conditions[0] = if indexed { "+i.org = :org" } else { "i.org = :org" }.to_string();
            let where_sql = conditions.join(" AND ");

            let count_matches = |where_sql: &str, params: &[(&'static str, Value)]| -> Result<i64> {
                let sql = format!("SELECT count(*) FROM items i WHERE {where_sql}");
                let mut stmt = tx.prepare_cached(&sql)?;
                let bound = bind(&stmt, params);
                Ok(stmt.query_row(bound.as_slice(), |r| r.get(0))?)
            };
            // Counted before the page only where the count chooses how to read it.
            let name_walk = indexed && q.sort == SortField::Name;
            let counted = if name_walk { Some(count_matches(&where_sql, &params)?) } else { None };

            let dir = if q.descending { "DESC" } else { "ASC" };
            let order = match q.sort {
                SortField::Name => format!("i.name COLLATE NOCASE {dir}, i.id {dir}"),
                SortField::Created => format!("i.created {dir}, i.id {dir}"),
                SortField::Flagged => format!("i.flagged {dir}, i.name COLLATE NOCASE ASC, i.id ASC"),
                SortField::Updated => format!("i.updated {dir}, i.id {dir}"),
            };
            // The page: from the ids and sorted, unless there are many matches and they are
            // wanted in name order, which `items_records` walks with no sort and stops early.
            let page_where_sql = if counted.is_some_and(|count| count > INDEXED_SORT_MATCHES_MAX) {
                conditions[0] = "i.org = :org".to_string();
                conditions.join(" AND ")
            } else {
                where_sql.clone()
            };
            let company_visible = visible(viewer, "c");
            // The page's ids first, sorted by their keys alone; then its rows with their
            // company and audit names. Sorted whole, every match's row (its fields, two
            // subqueries, the audit joins) went through the sorter before the page was cut
            // out of it: 5.7 s for the last 100 of 100,000 contacts by creation time.
            let sql = format!(
                "SELECT {RECORD_COLUMNS},
                    (SELECT group_concat(c.name, ', ' ORDER BY r.id) FROM relations r JOIN items c ON c.id = r.related
                      WHERE r.item = i.id AND c.typeid = {COMPANY_TYPEID} AND c.archived IS NULL AND {company_visible}),
                    (SELECT r.related FROM relations r JOIN items c ON c.id = r.related
                      WHERE r.item = i.id AND c.typeid = {COMPANY_TYPEID} AND c.archived IS NULL AND {company_visible}
                      ORDER BY r.id LIMIT 1)
                 FROM (SELECT i.id FROM items i WHERE {page_where_sql} ORDER BY {order} LIMIT :limit OFFSET :start) AS page
                      JOIN items i ON i.id = page.id {AUDIT_JOINS}
                 ORDER BY {order}"
            );
            params.push((":limit", Value::Integer(i64::from(q.limit))));
            params.push((":start", Value::Integer(i64::try_from(q.start).unwrap_or(i64::MAX))));
            let mut stmt = tx.prepare_cached(&sql)?;
            let bound = bind(&stmt, &params);
            let mut entries = stmt
                .query_map(bound.as_slice(), |row| {
                    Ok(ListEntry {
                        record: record_from_row(row)?,
                        company: row.get::<_, Option<String>>(13)?.unwrap_or_default(),
                        parent_id: row.get::<_, Option<i64>>(14)?.unwrap_or(0),
                        categories: Vec::new(),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let count = match counted {
                Some(count) => u64::try_from(count).unwrap_or(0),
                None => matches_total(q.start, q.limit, entries.len(), || count_matches(&where_sql, &params))?,
            };
            if q.with_categories && !entries.is_empty() {
                let ids: Vec<i64> = entries.iter().map(|e| e.record.id).collect();
                let mut by_item = categories_of(tx, &ids)?;
                for e in &mut entries {
                    e.categories = by_item.remove(&e.record.id).unwrap_or_default();
                }
            }
            Ok((entries, count))
        })?;
        for e in &mut entries {
            e.record.viewed = self.viewed_overlay(e.record.id, e.record.viewed);
        }
        Ok((entries, count))
    }

    /// Erases a deleted record for good, with its activities (and their files), its tags, its
    /// links from and to other records, its indexed values and the webhook deliveries about
    /// them, sent or not; devices and alerts that named it as their contact name none. A record
    /// not deleted is refused: deleting is what can be undone, erasing what cannot.
    pub fn erase_record(&self, record_type: RecordType, id: i64) -> Result<Erased> {
        self.write(|tx| {
            let archived: Option<Option<i64>> = tx
                .query_row(
                    "SELECT archived FROM items WHERE id = ?1 AND typeid = ?2 AND parent IS NULL",
                    (id, record_type.typeid()),
                    |r| r.get(0),
                )
                .optional()?;
            match archived {
                None => return Err(StoreError::NotFound),
                Some(a) if a != Some(id) => {
                    return Err(StoreError::BadReference(format!(
                        "{} {id} is not deleted: delete it first (it can be restored until it is erased)",
                        record_type.segment()
                    )));
                }
                Some(_) => {}
            }
            let doomed = "(SELECT id FROM items WHERE id = ?1 OR record_id = ?1)";
            let mut rows = 0;
            for sql in [
                format!("DELETE FROM files WHERE item_id IN {doomed}"),
                format!("DELETE FROM item_categories WHERE item_id IN {doomed}"),
                format!("DELETE FROM field_values WHERE item IN {doomed}"),
                format!("DELETE FROM relations WHERE item IN {doomed} OR related IN {doomed}"),
            ] {
                rows += tx.exec(&sql, [id])?;
            }
            if record_type == RecordType::Contact {
                // Where she was goes with her: her history and visits with every device she
                // held (after the erase nothing names her, so nothing could forget it later).
                let org: String = tx.query_row("SELECT org FROM items WHERE id = ?1", [id], |r| r.get(0))?;
                rows += super::location::purge_contact_in(tx, &org, id, crate::timefmt::now_ms())?;
            }
            // Her devices' stays in progress go on as no one's (the trigger of schema 15); the
            // moment of hers that it ended goes too.
            tx.exec("UPDATE devices SET contact_id = NULL WHERE contact_id = ?1", [id])?;
            if record_type == RecordType::Contact {
                rows += tx.exec("DELETE FROM visits WHERE contact_id = ?1", [id])?;
            }
            let (deliveries, unsent) = super::hooks::forget_deliveries_of(tx, id)?;
            rows += deliveries;
            tx.exec("UPDATE alerts SET contact_id = NULL WHERE contact_id = ?1", [id])?;
            rows += tx.exec("DELETE FROM items WHERE id = ?1 OR record_id = ?1", [id])?;
            Ok(Erased { rows, unsent_deliveries: unsent })
        })
    }

    /// Makes `field_values` hold the field from now on, filled from the records there are
    /// (once per field: later calls only look). The filling goes in writes of at most
    /// `STORE_FIELD_INDEX_FILL_ITEMS` items, so that other writes go between them: in one,
    /// it held every write for 1.6 s at 100,000 contacts. Writes keep the field up from the
    /// first step on (it is in `indexed_fields`), and a step keys each item as it is then, so
    /// a change made between steps is kept either way. A request that stops (its client has
    /// gone, its time is up) leaves the rest to the next search on the field.
    pub(super) fn index_field(&self, field: &str) -> Result<()> {
        self.index_field_in_steps(field, crate::limits::STORE_FIELD_INDEX_FILL_ITEMS)
    }

    pub(super) fn index_field_in_steps(&self, field: &str, step_items: i64) -> Result<()> {
        // No row: not indexed; `filled_to` NULL: filled; else filled up to that item id.
        let state: Option<Option<i64>> = self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT filled_to FROM indexed_fields WHERE field = ?1")?
                .query_row([field], |r| r.get(0))
                .optional()?)
        })?;
        match state {
            Some(None) => return Ok(()),
            Some(Some(_)) => {}
            None => {
                self.write(|tx| {
                    tx.exec("INSERT OR IGNORE INTO indexed_fields (field, filled_to) VALUES (?1, 0)", [field])?;
                    Ok(())
                })?;
            }
        }
        while !self.fill_field_step(field, step_items)? {
            if super::budget::read_should_stop() {
                return Err(super::budget::stopped());
            }
            // The writer's lock is not fair: taken again at once, it went to this loop again
            // and again while other writes waited for it (up to 1.2 s).
            std::thread::sleep(std::time::Duration::from_millis(crate::limits::STORE_FIELD_INDEX_FILL_PAUSE_MS));
        }
        Ok(())
    }

    /// Keys the next `step_items` items of the field's filling in one write; true once it is
    /// filled.
    pub(super) fn fill_field_step(&self, field: &str, step_items: i64) -> Result<bool> {
        self.write(|tx| {
            let from: Option<i64> = tx
                .prepare_cached("SELECT filled_to FROM indexed_fields WHERE field = ?1")?
                .query_row([field], |r| r.get(0))?;
            let Some(from) = from else { return Ok(true) };
            let until: Option<i64> = tx
                .prepare_cached("SELECT max(id) FROM (SELECT id FROM items WHERE id > ?1 ORDER BY id LIMIT ?2)")?
                .query_row((from, step_items), |r| r.get(0))?;
            let Some(until) = until else {
                tx.exec("UPDATE indexed_fields SET filled_to = NULL WHERE field = ?1", [field])?;
                return Ok(true);
            };
            tx.exec(
                "INSERT OR IGNORE INTO field_values (field, value, item)
                 SELECT ?1, sg_field_key(v), id FROM
                    (SELECT i.id, json_extract(i.fields, ?2) AS v FROM items i
                      WHERE i.id > ?3 AND i.id <= ?4 AND i.parent IS NULL)
                 WHERE v <> ''",
                (field, format!("$.\"{field}\""), from, until),
            )?;
            tx.exec("UPDATE indexed_fields SET filled_to = ?2 WHERE field = ?1", (field, until))?;
            Ok(false)
        })
    }

    /// Creates a category tag for a record type; a name already used (ignoring case, all of
    /// Unicode's: `ÉCOLE` is `école`) is a duplicate.
    pub fn create_category(&self, viewer: &Viewer, record_type: RecordType, name: &str) -> Result<i64> {
        self.write(|tx| {
            let existing: Option<i64> = tx
                .query_row(
                    "SELECT id FROM categories WHERE org = ?1 AND record_type = ?2 AND sg_lower(name) = sg_lower(?3)
                     LIMIT 1",
                    (&viewer.org, record_type.typeid(), name),
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = existing {
                return Err(StoreError::Duplicate(format!("category tag {name:?} already exists with id {id}")));
            }
            tx.exec(
                "INSERT INTO categories (org, record_type, name, created, creator) VALUES (?1, ?2, ?3, ?4, ?5)",
                (&viewer.org, record_type.typeid(), name, now_secs(), viewer.user_id),
            )?;
            Ok(tx.last_insert_rowid())
        })
    }

    pub fn list_categories(&self, viewer: &Viewer, record_type: RecordType) -> Result<Vec<CategoryRef>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT id, name FROM categories WHERE org = ?1 AND record_type = ?2 ORDER BY name COLLATE NOCASE, id",
            )?;
            let rows = stmt.query_map((&viewer.org, record_type.typeid()), |r| {
                Ok(CategoryRef { id: r.get(0)?, name: r.get(1)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }
}

/// The number of matches of a query whose page of at most `limit` from `start` had `rows`
/// rows: a page short of its limit, and not past the end, ends the matches, so they are
/// counted (again, over all of them) only otherwise. A filter that reads every record read
/// them twice for every list, once for the page and once for the count.
pub(super) fn matches_total(start: u64, limit: u32, rows: usize, count: impl FnOnce() -> Result<i64>) -> Result<u64> {
    let rows = rows as u64;
    if rows < u64::from(limit) && (rows > 0 || start == 0) {
        return Ok(start.saturating_add(rows));
    }
    Ok(u64::try_from(count()?).unwrap_or(0))
}

/// Binds the named parameters the statement actually uses.
pub(super) fn bind<'a>(
    stmt: &rusqlite::Statement<'_>,
    params: &'a [(&'static str, Value)],
) -> Vec<(&'a str, &'a dyn ToSql)> {
    params
        .iter()
        .filter(|(name, _)| stmt.parameter_index(name).ok().flatten().is_some())
        .map(|(name, value)| (*name, value as &dyn ToSql))
        .collect()
}

fn like_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn filter_sql(filter: &Filter, conditions: &mut Vec<String>, params: &mut Vec<(&'static str, Value)>) {
    let mut push = |sql: &str| conditions.push(sql.to_string());
    // Open, dated tasks (14) and follow-ups (6).
    let open_due = "EXISTS (SELECT 1 FROM items a WHERE a.record_id = i.id AND a.parent IS NOT NULL \
                    AND a.archived IS NULL AND a.typeid IN (14, 6) AND a.completed = 0 AND a.due IS NOT NULL AND";
    match filter {
        Filter::None | Filter::Archived => {}
        Filter::Flagged => push("i.flagged = 1"),
        Filter::Assigned(ids) => {
            params.push((":assigned", Value::Text(json_ids(ids))));
            push("CAST(json_extract(i.fields, '$.assignedto') AS INTEGER) IN (SELECT value FROM json_each(:assigned))");
        }
        Filter::NoCategory => push("NOT EXISTS (SELECT 1 FROM item_categories ic WHERE ic.item_id = i.id)"),
        Filter::ViewedSince(t)
        | Filter::NotViewedSince(t)
        | Filter::CreatedSince(t)
        | Filter::UpdatedSince(t)
        | Filter::NotUpdatedSince(t)
        | Filter::UpdatedAfter(t) => {
            let sql = match filter {
                Filter::ViewedSince(_) => "i.viewed >= :since",
                Filter::NotViewedSince(_) => "(i.viewed IS NULL OR i.viewed < :since)",
                Filter::CreatedSince(_) => "i.created >= :since",
                Filter::UpdatedSince(_) => "i.updated >= :since",
                Filter::NotUpdatedSince(_) => "i.updated < :since",
                // At or after, to the second: a client syncing from the last `updated` it saw
                // gets that record again, and misses none changed in the same second after it.
                _ => "i.updated >= :since",
            };
            params.push((":since", Value::Integer(*t)));
            push(sql);
        }
        Filter::DueBetween(from, to) => {
            params.push((":due_from", Value::Text(from.clone())));
            params.push((":due_to", Value::Text(to.clone())));
            push(&format!("{open_due} a.due BETWEEN :due_from AND :due_to)"));
        }
        Filter::DueBefore(date) => {
            params.push((":due_to", Value::Text(date.clone())));
            push(&format!("{open_due} a.due < :due_to)"));
        }
        Filter::Owner(id) => {
            params.push((":owner", Value::Integer(*id)));
            push("i.ownership = :owner");
        }
        Filter::Category { ids, all } => {
            params.push((":cats", Value::Text(json_ids(ids))));
            if *all {
                params.push((":cats_n", Value::Integer(ids.len() as i64)));
                push(
                    "(SELECT count(*) FROM item_categories ic WHERE ic.item_id = i.id \
                     AND ic.category_id IN (SELECT DISTINCT value FROM json_each(:cats))) = \
                     (SELECT count(DISTINCT value) FROM json_each(:cats))",
                );
            } else {
                push(
                    "EXISTS (SELECT 1 FROM item_categories ic WHERE ic.item_id = i.id \
                     AND ic.category_id IN (SELECT value FROM json_each(:cats)))",
                );
            }
        }
        Filter::Unsent { email_fields } => {
            let has_address = any_field(email_fields, |f| format!("coalesce({f}, '') <> ''"));
            push(&format!(
                "{has_address} AND NOT EXISTS (SELECT 1 FROM items a WHERE a.record_id = i.id AND a.parent IS NOT NULL \
                 AND a.archived IS NULL AND a.typeid IN {EMAIL_ACTIVITY_TYPEIDS})"
            ));
        }
        Filter::ByPhone { digits, fields } => {
            params.push((":digits", Value::Text(digits.clone())));
            push(&any_field(fields, |f| format!("sg_digits({f}) LIKE '%' || :digits")));
        }
        Filter::ByEmail { address, fields } => {
            params.push((":address", Value::Text(address.clone())));
            push(&any_field(fields, |f| format!("{f} = :address COLLATE NOCASE")));
        }
    }
}

/// `(cond(field1) OR cond(field2) ...)` over the record's fields, each given to `cond` as a
/// `json_extract` expression; false when there are no such fields. Field names come from the
/// model (letters and digits), never from the request.
fn any_field(fields: &[String], cond: impl Fn(&str) -> String) -> String {
    let parts: Vec<String> = fields
        .iter()
        .filter(|f| f.bytes().all(|b| b.is_ascii_alphanumeric()))
        .map(|f| cond(&format!("json_extract(i.fields, '$.{f}')")))
        .collect();
    if parts.is_empty() { "0".to_string() } else { format!("({})", parts.join(" OR ")) }
}

/// Matches of a field search (through `field_values`) up to which a page in name order is
/// read from the matches and sorted; with more, the name index is walked instead.
const INDEXED_SORT_MATCHES_MAX: i64 = 300;

/// Searches match lower-cased text: the `search` column holds the name and values lower-cased,
/// each after a separator, so "starts with" is "contains separator + text". A "starts with"
/// search on one field reads `field_values`; then the answer is true.
fn search_sql(search: &Search, conditions: &mut Vec<String>, params: &mut Vec<(&'static str, Value)>) -> bool {
    let pattern = |mode: SearchMode, value: &str, separated: bool| {
        let text = like_escape(&value.to_lowercase());
        match (mode, separated) {
            (SearchMode::StartsWith, true) => format!("%{SEARCH_SEPARATOR}{text}%"),
            (SearchMode::StartsWith, false) => format!("{text}%"),
            _ => format!("%{text}%"),
        }
    };
    let item_match = "i.search LIKE :pattern ESCAPE '\\'";
    let journal_match = "EXISTS (SELECT 1 FROM items a WHERE a.record_id = i.id AND a.parent IS NOT NULL \
                         AND a.archived IS NULL AND a.search LIKE :pattern ESCAPE '\\')";
    match search {
        Search::Field { name, mode: SearchMode::StartsWith, value } if !value.is_empty() => {
            // Keys in `field_values` that start with the text lie in [text, next): `next` is
            // the text with its last byte one higher (UTF-8 has no 0xFF byte, so no carry),
            // compared as text byte by byte.
            let key = field_key(value);
            let mut next = key.clone().into_bytes();
            if let Some(last) = next.last_mut() {
                *last += 1;
            }
            params.push((":field", Value::Text(name.clone())));
            params.push((":from", Value::Text(key.clone())));
            params.push((":until", Value::Blob(next)));
            conditions.push(
                "i.id IN (SELECT item FROM field_values WHERE field = :field AND value >= :from \
                 AND value < CAST(:until AS TEXT))"
                    .to_string(),
            );
            if value.to_lowercase().chars().count() > FIELD_KEY_CHARS {
                // The index holds the first characters only: check the whole value too.
                params.push((":path", Value::Text(format!("$.\"{name}\""))));
                params.push((":pattern", Value::Text(pattern(SearchMode::StartsWith, value, false))));
                conditions.push(
                    "sg_lower(coalesce(json_extract(i.fields, :path), '')) LIKE :pattern ESCAPE '\\'".to_string(),
                );
            }
            return true;
        }
        Search::Any { mode, value } => {
            params.push((":pattern", Value::Text(pattern(*mode, value, true))));
            conditions.push(format!("({item_match} OR {journal_match})"));
        }
        Search::AnyItem { mode, value } => {
            params.push((":pattern", Value::Text(pattern(*mode, value, true))));
            conditions.push(item_match.to_string());
        }
        Search::AnyJournal { mode, value } => {
            params.push((":pattern", Value::Text(pattern(*mode, value, true))));
            conditions.push(journal_match.to_string());
        }
        Search::Field { name, mode, value } => {
            params.push((":path", Value::Text(format!("$.\"{name}\""))));
            let expr = "coalesce(json_extract(i.fields, :path), '')";
            match mode {
                SearchMode::Empty => conditions.push(format!("{expr} = ''")),
                SearchMode::NotEmpty => conditions.push(format!("{expr} <> ''")),
                SearchMode::StartsWith | SearchMode::Contains => {
                    params.push((":pattern", Value::Text(pattern(*mode, value, false))));
                    // The `search` column holds every value lower-cased: a row whose value
                    // matches holds the text there too, and that test is far cheaper than
                    // reading the field out of the JSON, so it goes first.
                    params.push((":prefilter", Value::Text(pattern(*mode, value, true))));
                    conditions.push(format!(
                        "i.search LIKE :prefilter ESCAPE '\\' AND sg_lower({expr}) LIKE :pattern ESCAPE '\\'"
                    ));
                }
            }
        }
    }
    false
}

/// What Show returns of a record in the given state.
pub(super) fn detail_of(
    tx: &Connection,
    viewer: &Viewer,
    record_type: RecordType,
    id: i64,
    state: State,
) -> Result<RecordDetail> {
    let (record, [has_categories, has_related, has_activities]) =
        load_record_with(tx, viewer, record_type, id, state, true)?;
    // Most records have no tags, links or activities: the record's own query says which it has,
    // and only those are read (a statement run costs more than its row lookups).
    let categories = if has_categories { categories_of_one(tx, id)? } else { Vec::new() };
    let related = if has_related { related_of(tx, viewer, id)? } else { Vec::new() };
    let activities = if has_activities { activities_of(tx, id)? } else { Vec::new() };
    Ok(RecordDetail { record, activities, categories, related })
}

/// Whether a record looked up must be live, archived by its own deletion, or either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Live,
    Deleted,
    Any,
}

/// A live (not archived) record of the type, visible to the viewer; else `NotFound`.
fn load_record(tx: &Connection, viewer: &Viewer, record_type: RecordType, id: i64) -> Result<RecordRow> {
    load_record_in(tx, viewer, record_type, id, State::Live)
}

/// A record of the type in the given state, visible to the viewer; else `NotFound`.
pub(super) fn load_record_in(
    tx: &Connection,
    viewer: &Viewer,
    record_type: RecordType,
    id: i64,
    state: State,
) -> Result<RecordRow> {
    Ok(load_record_with(tx, viewer, record_type, id, state, false)?.0)
}

/// Whether the record has category tags, related items and live activities: three more
/// columns after `RECORD_COLUMNS`.
const PRESENCE_COLUMNS: &str = ",
    EXISTS (SELECT 1 FROM item_categories ic WHERE ic.item_id = i.id),
    EXISTS (SELECT 1 FROM relations r WHERE r.item = i.id),
    EXISTS (SELECT 1 FROM items a WHERE a.record_id = i.id AND a.parent IS NOT NULL AND a.archived IS NULL)";

/// The statement of [`load_record_with`] for each state, presence flag and kind of viewer,
/// built once (a show runs one of them; building it for each request was measurable).
fn record_sql(state: State, presence: bool, admin: bool) -> &'static str {
    const STATES: [State; 3] = [State::Live, State::Deleted, State::Any];
    static SQL: OnceLock<Vec<String>> = OnceLock::new();
    let all = SQL.get_or_init(|| {
        let mut all = Vec::with_capacity(STATES.len() * 4);
        for state in STATES {
            let archived = match state {
                State::Live => "i.archived IS NULL",
                State::Deleted => "i.archived = i.id",
                State::Any => "1",
            };
            for presence in [false, true] {
                let extra = if presence { PRESENCE_COLUMNS } else { "" };
                for admin in [false, true] {
                    let visible = if admin { "1" } else { "i.ownership IN (SELECT value FROM json_each(?4))" };
                    all.push(format!(
                        "SELECT {RECORD_COLUMNS}{extra} FROM items i {AUDIT_JOINS}
                         WHERE i.id = ?1 AND i.org = ?2 AND i.typeid = ?3 AND i.parent IS NULL AND {archived}
                           AND {visible}"
                    ));
                }
            }
        }
        all
    });
    let state_index = STATES.iter().position(|s| *s == state).unwrap_or(0);
    &all[state_index * 4 + usize::from(presence) * 2 + usize::from(admin)]
}

/// [`load_record_in`]; with `presence`, also the flags of [`PRESENCE_COLUMNS`] (else all false).
fn load_record_with(
    tx: &Connection,
    viewer: &Viewer,
    record_type: RecordType,
    id: i64,
    state: State,
    presence: bool,
) -> Result<(RecordRow, [bool; 3])> {
    let sql = record_sql(state, presence, viewer.admin);
    let owners = if viewer.admin { String::new() } else { owner_ids_json(viewer) };
    let mut stmt = tx.prepare_cached(sql)?;
    debug_assert_eq!(stmt.column_count(), RECORD_COLUMN_COUNT + if presence { 3 } else { 0 });
    let flag = |row: &Row<'_>, i: usize| -> rusqlite::Result<bool> {
        Ok(presence && row.get::<_, bool>(RECORD_COLUMN_COUNT + i)?)
    };
    // Positional: `?4` (the viewer's owner ids) only where the viewer is not an administrator.
    let typeid = record_type.typeid();
    let all: [&dyn ToSql; 4] = [&id, &viewer.org, &typeid, &owners];
    let params = if viewer.admin { &all[..3] } else { &all[..] };
    stmt.query_row(params, |row| Ok((record_from_row(row)?, [flag(row, 0)?, flag(row, 1)?, flag(row, 2)?])))
        .optional()?
        .ok_or(StoreError::NotFound)
}

/// Ownership may be the viewer's own id or one of their groups; administrators may give any
/// user or group of the organisation.
fn check_ownership(tx: &Connection, viewer: &Viewer, ownership: i64) -> Result<()> {
    let kind = principal_kind(tx, &viewer.org, ownership)?;
    let Some(kind) = kind else {
        return Err(StoreError::BadReference(format!("ownership {ownership} is not a user or group id")));
    };
    // A user with preventprivatedata never owns records, whoever gives them one.
    if kind == PrincipalKind::User {
        let prevented: bool = tx
            .prepare_cached("SELECT prevent_private FROM principals WHERE id = ?1")?
            .query_row([ownership], |r| r.get(0))?;
        if prevented {
            return Err(StoreError::Forbidden(if ownership == viewer.user_id {
                "this user may not own private records: give a group id as ownership".into()
            } else {
                format!("user {ownership} may not own records (preventprivatedata): give a group id as ownership")
            }));
        }
    }
    if viewer.admin || viewer.owner_ids().contains(&ownership) {
        Ok(())
    } else {
        Err(StoreError::Forbidden(format!("ownership {ownership} is neither your user id nor one of your groups")))
    }
}

/// An `assignedto` must name a user or group of the organisation that is not deleted, unless
/// it is the value the record already holds: a client that sends back what it read (an edit
/// form) can still save a record whose assignee was deleted since.
fn check_principal_fields(
    tx: &Connection,
    viewer: &Viewer,
    fields: &FieldValues,
    current: Option<&FieldValues>,
) -> Result<()> {
    let unchanged = |v: &String| current.and_then(|c| c.get("assignedto")) == Some(v);
    if let Some(v) = fields.get("assignedto").filter(|v| !v.is_empty() && !unchanged(v)) {
        let id: i64 = v.parse().map_err(|_| StoreError::BadReference(format!("assignedto {v} is not an id")))?;
        if principal_kind(tx, &viewer.org, id)?.is_none() {
            return Err(StoreError::BadReference(format!("assignedto {id} is not a user or group id")));
        }
    }
    Ok(())
}

fn category_exists(tx: &Connection, viewer: &Viewer, record_type: RecordType, id: i64) -> Result<()> {
    let found = tx
        .prepare_cached("SELECT 1 FROM categories WHERE id = ?1 AND org = ?2 AND record_type = ?3")?
        .query_row((id, &viewer.org, record_type.typeid()), |_| Ok(()))
        .optional()?;
    found.ok_or_else(|| {
        StoreError::BadReference(format!("category tag {id} does not exist for {}", record_type.segment()))
    })
}

/// Adds and removes category tags of a record; every id must be a tag of the record's type.
/// Returns how many were really added and removed.
fn change_categories(
    tx: &Connection,
    viewer: &Viewer,
    record_type: RecordType,
    item: i64,
    add: &[i64],
    remove: &[i64],
) -> Result<(usize, usize)> {
    let changes = [
        (add, "INSERT OR IGNORE INTO item_categories (item_id, category_id) VALUES (?1, ?2)"),
        (remove, "DELETE FROM item_categories WHERE item_id = ?1 AND category_id = ?2"),
    ];
    let mut counts = [0usize; 2];
    for (n, (ids, sql)) in changes.into_iter().enumerate() {
        for id in ids {
            category_exists(tx, viewer, record_type, *id)?;
            counts[n] += tx.prepare_cached(sql)?.execute((item, id))?;
        }
    }
    Ok((counts[0], counts[1]))
}

/// Links `item` to each target (a live, visible contact, company or project blog of the
/// organisation); adding an existing link replaces its note.
/// Relates `item` to each target (or sets its note); returns how many relations were made or
/// had their note changed.
fn add_related(tx: &Connection, viewer: &Viewer, item: i64, targets: &[(i64, String)]) -> Result<usize> {
    let mut changed = 0;
    for (target, note) in targets {
        let not_found = || StoreError::BadReference(format!("related item {target} does not exist"));
        if *target == item {
            return Err(StoreError::BadReference("a record cannot be related to itself".into()));
        }
        let typeid: i64 = tx
            .prepare_cached(
                "SELECT typeid, ownership FROM items WHERE id = ?1 AND org = ?2 AND parent IS NULL AND archived IS NULL",
            )?
            .query_row((target, &viewer.org), |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
            .optional()?
            .filter(|(_, ownership)| viewer.admin || viewer.owner_ids().contains(ownership))
            .map(|(t, _)| t)
            .ok_or_else(not_found)?;
        let can = RecordType::from_typeid(typeid).is_some_and(RecordType::can_be_related);
        if !can {
            return Err(StoreError::BadReference(format!(
                "related item {target} is not a contact, company or project blog"
            )));
        }
        changed += tx
            .prepare_cached(
                "INSERT INTO relations (item, related, note) VALUES (?1, ?2, ?3)
                 ON CONFLICT (item, related) DO UPDATE SET note = excluded.note WHERE note IS NOT excluded.note",
            )?
            .execute((item, target, note))?;
    }
    Ok(changed)
}

fn categories_of(tx: &Connection, items: &[i64]) -> Result<HashMap<i64, Vec<CategoryRef>>> {
    let mut stmt = tx.prepare_cached(
        "SELECT ic.item_id, c.id, c.name FROM item_categories ic JOIN categories c ON c.id = ic.category_id
         WHERE ic.item_id IN (SELECT value FROM json_each(?1)) ORDER BY c.name COLLATE NOCASE, c.id",
    )?;
    let mut out: HashMap<i64, Vec<CategoryRef>> = HashMap::new();
    let rows = stmt
        .query_map([json_ids(items)], |r| Ok((r.get::<_, i64>(0)?, CategoryRef { id: r.get(1)?, name: r.get(2)? })))?;
    for row in rows {
        let (item, cat) = row?;
        out.entry(item).or_default().push(cat);
    }
    Ok(out)
}

/// One item's category tags, by name (the list form without its temporary tables).
fn categories_of_one(tx: &Connection, item: i64) -> Result<Vec<CategoryRef>> {
    // Sorted here rather than by ORDER BY: most records have none, and SQLite sets up a sorter
    // for every run of an ORDER BY that no index gives (some 900 instructions a query).
    let mut stmt = tx.prepare_cached(
        "SELECT c.id, c.name FROM item_categories ic JOIN categories c ON c.id = ic.category_id
         WHERE ic.item_id = ?1",
    )?;
    let rows = stmt.query_map([item], |r| Ok(CategoryRef { id: r.get(0)?, name: r.get(1)? }))?;
    let mut out = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    out.sort_by(|a, b| nocase_cmp(&a.name, &b.name).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// Of the records `ids`, the live ones the viewer may see (within a transaction).
pub(super) fn visible_ids_in(tx: &Connection, viewer: &Viewer, ids: &[i64]) -> Result<std::collections::HashSet<i64>> {
    let mut params: Vec<(&'static str, Value)> =
        vec![(":ids", Value::Text(super::json_ids(ids))), (":org", Value::Text(viewer.org.clone()))];
    if !viewer.admin {
        params.push((":owners", Value::Text(owner_ids_json(viewer))));
    }
    let sql = format!(
        "SELECT i.id FROM items i WHERE i.id IN (SELECT value FROM json_each(:ids)) AND i.org = :org
         AND i.archived IS NULL AND {}",
        visible(viewer, "i")
    );
    let mut stmt = tx.prepare(&sql)?;
    let refs: Vec<(&str, &dyn rusqlite::ToSql)> = params.iter().map(|(k, v)| (*k, v as &dyn rusqlite::ToSql)).collect();
    let rows = stmt.query_map(refs.as_slice(), |r| r.get::<_, i64>(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The order of SQLite's `COLLATE NOCASE`: bytes, with ASCII letters folded to lower case.
fn nocase_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.bytes().map(|c| c.to_ascii_lowercase()).cmp(b.bytes().map(|c| c.to_ascii_lowercase()))
}

fn related_of(tx: &Connection, viewer: &Viewer, item: i64) -> Result<Vec<RelatedItem>> {
    let sql = format!(
        "SELECT c.id, c.typeid, c.name, r.note, r.id FROM relations r JOIN items c ON c.id = r.related
         WHERE r.item = :item AND c.archived IS NULL AND {}",
        visible(viewer, "c")
    );
    let mut params: Vec<(&'static str, Value)> = vec![(":item", Value::Integer(item))];
    if !viewer.admin {
        params.push((":owners", Value::Text(owner_ids_json(viewer))));
    }
    let mut stmt = tx.prepare_cached(&sql)?;
    let bound = bind(&stmt, &params);
    let rows = stmt.query_map(bound.as_slice(), |r| {
        Ok((r.get::<_, i64>(4)?, RelatedItem { id: r.get(0)?, typeid: r.get(1)?, name: r.get(2)?, note: r.get(3)? }))
    })?;
    // In the order the links were made (sorted here, as categories_of_one says why).
    let mut out = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    out.sort_by_key(|(link, _)| *link);
    Ok(out.into_iter().map(|(_, related)| related).collect())
}

const ACTIVITY_SELECT: &str = "SELECT i.id, i.typeid, i.parent, i.level, i.position, i.name, i.fields, i.flagged,
        i.created, i.updated, i.viewed, i.creator, coalesce(cu.name, ''), i.modificator, coalesce(mu.name, ''),
        f.name, f.content_type, f.size
     FROM items i LEFT JOIN principals cu ON cu.id = i.creator LEFT JOIN principals mu ON mu.id = i.modificator
          LEFT JOIN files f ON f.item_id = i.id";

fn activity_from_row(r: &Row<'_>) -> rusqlite::Result<ActivityRow> {
    Ok(ActivityRow {
        id: r.get(0)?,
        typeid: r.get(1)?,
        parent: r.get(2)?,
        level: r.get(3)?,
        position: r.get(4)?,
        name: r.get(5)?,
        fields: answer_fields(&r.get::<_, String>(6)?)?,
        flagged: r.get(7)?,
        created: r.get(8)?,
        updated: r.get(9)?,
        viewed: r.get(10)?,
        creator_id: r.get(11)?,
        creator_name: r.get(12)?,
        modificator_id: r.get(13)?,
        modificator_name: r.get(14)?,
        file: match r.get::<_, Option<String>>(15)? {
            Some(name) => Some(FileInfo { name, content_type: r.get(16)?, size: r.get(17)? }),
            None => None,
        },
    })
}

/// The live activities under a record, flat, in tree order (each parent before its children,
/// siblings by position).
pub(super) fn activities_of(tx: &Connection, record: i64) -> Result<Vec<ActivityRow>> {
    let mut stmt = tx.prepare_cached(&format!(
        "{ACTIVITY_SELECT} WHERE i.record_id = ?1 AND i.parent IS NOT NULL AND i.archived IS NULL"
    ))?;
    // By position, then id (sorted here, as categories_of_one says why).
    let mut rows = stmt.query_map([record], activity_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
    rows.sort_by_key(|a| (a.position, a.id));
    Ok(tree_order(record, rows))
}

/// One activity, archived or not.
pub(super) fn activity_by_id(tx: &Connection, id: i64) -> Result<ActivityRow> {
    let mut stmt = tx.prepare_cached(&format!("{ACTIVITY_SELECT} WHERE i.id = ?1 AND i.parent IS NOT NULL"))?;
    stmt.query_row([id], activity_from_row).optional()?.ok_or(StoreError::NotFound)
}

/// Orders activities depth-first from the record, siblings as given (by position).
fn tree_order(root: i64, rows: Vec<ActivityRow>) -> Vec<ActivityRow> {
    let mut children: HashMap<i64, Vec<usize>> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        children.entry(row.parent).or_default().push(i);
    }
    let mut order = Vec::with_capacity(rows.len());
    let mut stack: Vec<usize> = children.get(&root).map(|c| c.iter().rev().copied().collect()).unwrap_or_default();
    while let Some(i) = stack.pop() {
        order.push(i);
        if let Some(kids) = children.get(&rows[i].id) {
            stack.extend(kids.iter().rev().copied());
        }
    }
    let mut slots: Vec<Option<ActivityRow>> = rows.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Category tags are sorted in Rust as SQLite's `ORDER BY name COLLATE NOCASE` would.
    #[test]
    fn nocase_order_is_sqlites() {
        let names = [
            "beta", "Beta", "BETA", "alpha", "Alpha2", "alpha1", "a_b", "aB", "ab", "a", "", "Zebra", "zeta", "Äpfel",
            "äpfel", "apfel", "ñ", "N", "n", "~", "[x]", "_x", "10", "9", "Ωmega", "a b", "a-b",
        ];
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (name TEXT NOT NULL)").unwrap();
        for n in names {
            conn.execute("INSERT INTO t VALUES (?1)", [n]).unwrap();
        }
        let by_sqlite: Vec<String> = conn
            .prepare("SELECT name FROM t ORDER BY name COLLATE NOCASE, rowid")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut by_rust: Vec<&str> = names.to_vec();
        by_rust.sort_by(|a, b| nocase_cmp(a, b));
        assert_eq!(by_rust, by_sqlite);
    }

    /// A record and its activity stamped while the wall clock ran an hour ahead, then changed
    /// after NTP stepped it back: `updated` stays where it was (never before the newest
    /// stamp, nor `created`), through an update, a delete and a restore, and a record made
    /// meanwhile is dated there too; once the clock is past it, a change moves it on.
    #[test]
    fn updated_never_goes_back_when_the_clock_does() {
        let (dir, store) = super::super::testing::store_with_org("updated", "acme");
        let viewer = super::super::testing::admin_of(&store, "acme");
        let fields = |name: &str| FieldValues::from([("lastname".to_string(), name.to_string())]);
        let new = NewRecord {
            record_type: RecordType::Contact,
            fields: fields("Lee"),
            ownership: None,
            flagged: false,
            categories_add: Vec::new(),
            related_add: Vec::new(),
        };
        let id = store.create_record(&viewer, new).unwrap();
        let note = super::super::NewActivity {
            kind: crate::model::activity::ActivityType::Note,
            parent: id,
            fields: FieldValues::from([("title".to_string(), "Met".to_string())]),
            place: None,
            upload: None,
        };
        store.create_activity(&viewer, note).unwrap();
        // Created and last changed (record, then activity) at `at`.
        let stamp = |at: i64| {
            store.write(|tx| {
                Ok(tx.execute("UPDATE items SET created = ?1, updated = ?1 WHERE record_id = ?2", (at, id))?)
            })
        };
        let stamps = || -> Vec<(i64, i64)> {
            store
                .read(|tx| {
                    let mut stmt = tx.prepare("SELECT created, updated FROM items WHERE record_id = ?1 ORDER BY id")?;
                    let rows = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    Ok(rows.collect::<rusqlite::Result<_>>()?)
                })
                .unwrap()
        };
        let ahead = now_secs() + 3_600;
        assert_eq!(stamp(ahead).unwrap(), 2);
        let changes = || RecordChanges { fields: fields("Li"), ..Default::default() };
        // A change while the clock is behind: dated as the newest change (sync clients asking
        // for what changed at or after it see it), never back.
        store.update_record(&viewer, RecordType::Contact, id, changes()).unwrap();
        assert_eq!(stamps(), vec![(ahead, ahead), (ahead, ahead)], "after an update");
        store.delete_record(&viewer, RecordType::Contact, id).unwrap();
        assert_eq!(stamps(), vec![(ahead, ahead), (ahead, ahead)], "after a delete");
        store.restore_record(&viewer, RecordType::Contact, id).unwrap();
        assert_eq!(stamps(), vec![(ahead, ahead), (ahead, ahead)], "after a restore");
        assert_eq!(store.show_record(&viewer, RecordType::Contact, id).unwrap().record.fields, fields("Li"));
        // Another record made while the clock is behind: dated as the newest change (a client
        // syncing from that one sees it), created now.
        let other = NewRecord {
            record_type: RecordType::Contact,
            fields: fields("Ng"),
            ownership: None,
            flagged: false,
            categories_add: Vec::new(),
            related_add: Vec::new(),
        };
        let before = now_secs();
        let other = store.create_record(&viewer, other).unwrap();
        let other = store.show_record(&viewer, RecordType::Contact, other).unwrap().record;
        assert_eq!(other.updated, ahead);
        assert!((before..=now_secs()).contains(&other.created), "{} not now", other.created);
        // Everything stamped an hour ago: a change is stamped now.
        let behind = now_secs() - 3_600;
        stamp(behind).unwrap();
        store
            .write(|tx| {
                tx.execute("UPDATE items SET updated = ?1 WHERE id = ?2", (behind, other.id))?;
                Ok(tx.execute("UPDATE updated_high SET v = ?1", [behind])?)
            })
            .unwrap();
        let before = now_secs();
        // (A change: one that changes nothing is not stamped.)
        store
            .update_record(
                &viewer,
                RecordType::Contact,
                id,
                RecordChanges { fields: fields("Lu"), ..Default::default() },
            )
            .unwrap();
        let record = store.show_record(&viewer, RecordType::Contact, id).unwrap().record;
        assert!((before..=now_secs()).contains(&record.updated), "{} not now", record.updated);
        assert_eq!(record.created, behind);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
