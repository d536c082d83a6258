//! Activities: create under a record or another activity, update (fields, position, parent),
//! soft delete with their subtree. An activity is visible to whoever sees its root record.

use rusqlite::{Connection, OptionalExtension};

use super::ExecCached;
use super::hooks::Target;
use super::principals::principal_kind;
use super::{Result, Store, StoreError, fields_json, merge_fields, parse_fields, search_text};
use crate::model::Kind;
use crate::model::activity::{ActivityType, ParentKind};
use crate::model::hook::Event;
use crate::model::{FieldValues, Upload, Viewer};
use crate::timefmt::now_secs;

/// Where among its siblings an activity goes.
#[derive(Clone, Copy, Debug)]
pub enum Place {
    After(i64),
    Before(i64),
}

pub struct NewActivity {
    pub kind: ActivityType,
    pub parent: i64,
    pub fields: FieldValues,
    pub place: Option<Place>,
    /// The uploaded file of a file, photo or attachment activity.
    pub upload: Option<Upload>,
}

#[derive(Default)]
pub struct ActivityChanges {
    /// Fields to set; an empty value clears the field.
    pub fields: FieldValues,
    pub place: Option<Place>,
    /// A new parent (record or activity).
    pub parent: Option<i64>,
    /// A new file, replacing the stored one.
    pub upload: Option<Upload>,
}

/// A file's stored description (its content is read separately).
#[derive(Clone, Debug)]
pub struct FileInfo {
    pub name: String,
    pub content_type: String,
    pub size: i64,
}

/// A file to download: description and content.
pub struct FileContent {
    pub info: FileInfo,
    pub content: Vec<u8>,
}

fn store_file(tx: &Connection, item: i64, upload: &Upload) -> Result<()> {
    use sha2::{Digest, Sha256};
    let sha = Sha256::digest(&upload.bytes).to_vec();
    tx.prepare_cached(
        "INSERT INTO files (item_id, name, content_type, size, sha256, content) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (item_id) DO UPDATE SET name = excluded.name, content_type = excluded.content_type,
             size = excluded.size, sha256 = excluded.sha256, content = excluded.content",
    )?
    .execute((item, &upload.name, &upload.content_type, upload.bytes.len() as i64, sha, &upload.bytes))?;
    Ok(())
}

pub struct CreatedActivity {
    pub id: i64,
    pub created: i64,
}

/// A live node (record or activity) that may become a parent.
struct Node {
    id: i64,
    typeid: i64,
    is_record: bool,
    record_id: i64,
    level: i64,
}

/// A live item of the viewer's organisation whose root record is live and visible.
fn load_node(tx: &Connection, viewer: &Viewer, id: i64) -> Result<Node> {
    let row: Option<(i64, i64, bool, i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT i.id, i.typeid, i.parent IS NULL, coalesce(i.record_id, i.id), i.level, r.ownership
             FROM items i JOIN items r ON r.id = coalesce(i.record_id, i.id)
             WHERE i.id = ?1 AND i.org = ?2 AND i.archived IS NULL AND r.archived IS NULL",
        )?
        .query_row((id, &viewer.org), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    let (id, typeid, is_record, record_id, level, ownership) = row.ok_or(StoreError::NotFound)?;
    if !viewer.admin && !viewer.owner_ids().contains(&ownership) {
        return Err(StoreError::NotFound);
    }
    Ok(Node { id, typeid, is_record, record_id, level })
}

fn check_parent(kind: ActivityType, parent: &Node) -> Result<()> {
    let parent_kind = if parent.is_record {
        Some(ParentKind::Record)
    } else {
        ActivityType::from_typeid(parent.typeid).map(ParentKind::Activity)
    };
    match parent_kind {
        Some(p) if kind.allowed_parents().contains(&p) => Ok(()),
        _ => Err(StoreError::WrongParent(format!(
            "a {} can be placed under {} only",
            kind.segment(),
            kind.allowed_parents_text()
        ))),
    }
}

/// The user and group fields (`assignedto`, `responsible`, `person`) must name a user or group
/// of the organisation that is not deleted, unless the value is the one the activity already
/// holds (`current`): a client sending back what it read can save an activity whose assignee
/// was deleted since.
fn check_principals(
    tx: &Connection,
    viewer: &Viewer,
    kind: ActivityType,
    fields: &FieldValues,
    current: Option<&FieldValues>,
) -> Result<()> {
    for f in kind.fields().iter().filter(|f| f.kind == Kind::Principal) {
        let unchanged = |v: &String| current.and_then(|c| c.get(f.name)) == Some(v);
        if let Some(v) = fields.get(f.name).filter(|v| !v.is_empty() && !unchanged(v)) {
            let id: i64 = v.parse().map_err(|_| StoreError::BadReference(format!("{} {v} is not an id", f.name)))?;
            if principal_kind(tx, &viewer.org, id)?.is_none() {
                return Err(StoreError::BadReference(format!("{} {id} is not a user or group id", f.name)));
            }
        }
    }
    Ok(())
}

/// The position for a new child of `parent`: after or before a sibling (shifting the ones
/// behind it), else at the end.
fn position_for(tx: &Connection, parent: i64, place: Option<Place>, moving: Option<i64>) -> Result<i64> {
    let Some(place) = place else {
        let last: Option<i64> = tx
            .prepare_cached("SELECT max(position) FROM items WHERE parent = ?1 AND archived IS NULL AND id IS NOT ?2")?
            .query_row((parent, moving), |r| r.get(0))?;
        return Ok(last.unwrap_or(0) + 1);
    };
    let sibling = match place {
        Place::After(s) | Place::Before(s) => s,
    };
    if Some(sibling) == moving {
        return Err(StoreError::BadReference("an activity cannot be placed relative to itself".into()));
    }
    let pos: i64 = tx
        .prepare_cached("SELECT position FROM items WHERE id = ?1 AND parent = ?2 AND archived IS NULL")?
        .query_row((sibling, parent), |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::BadReference(format!("activity {sibling} is not under the same parent")))?;
    let (new_pos, from) = match place {
        Place::After(_) => (pos + 1, pos + 1),
        Place::Before(_) => (pos, pos),
    };
    tx.prepare_cached(
        "UPDATE items SET position = position + 1 WHERE parent = ?1 AND position >= ?2 AND archived IS NULL AND id IS NOT ?3",
    )?
    .execute((parent, from, moving))?;
    Ok(new_pos)
}

/// A type a parent holds one of (linked e-mails) may not join a parent that has a live one:
/// made there, moved there, or restored there.
fn check_one_per_parent(tx: &Connection, kind: ActivityType, parent: i64) -> Result<()> {
    if !kind.one_per_parent() {
        return Ok(());
    }
    let exists = tx
        .prepare_cached("SELECT 1 FROM items WHERE parent = ?1 AND typeid = ?2 AND archived IS NULL")?
        .query_row((parent, kind.typeid()), |_| Ok(()))
        .optional()?;
    match exists {
        Some(()) => Err(StoreError::Duplicate(format!(
            "item {parent} already has a {}; there is one per parent",
            kind.segment()
        ))),
        None => Ok(()),
    }
}

impl Store {
    pub fn create_activity(&self, viewer: &Viewer, new: NewActivity) -> Result<CreatedActivity> {
        self.write_emitting(|tx| {
            let parent = load_node(tx, viewer, new.parent)?;
            check_parent(new.kind, &parent)?;
            check_one_per_parent(tx, new.kind, parent.id)?;
            check_principals(tx, viewer, new.kind, &new.fields, None)?;
            let position = position_for(tx, parent.id, new.place, None)?;
            let now = now_secs();
            let stamp = super::records::updated_stamp(tx, now)?;
            let title = new.kind.title(&new.fields);
            tx.prepare_cached(
                "INSERT INTO items (org, typeid, record_id, parent, ownership, name, fields, search, position, level,
                                    due, completed, completed_at, created, updated, creator, modificator)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, CASE WHEN ?12 THEN ?13 END, ?13, ?15,
                         ?14, ?14)",
            )?
            .execute((
                &viewer.org,
                new.kind.typeid(),
                parent.record_id,
                parent.id,
                viewer.user_id,
                &title,
                fields_json(&new.fields),
                search_text(&title, &new.fields),
                position,
                parent.level + 1,
                new.kind.date(&new.fields),
                ActivityType::completed(&new.fields),
                now,
                viewer.user_id,
                stamp,
            ))?;
            let id = tx.last_insert_rowid();
            if let Some(upload) = &new.upload {
                store_file(tx, id, upload)?;
            }
            let wrote = self.emit(tx, &viewer.org, &[Event::ActivitiesCreate], Target::Activity(new.kind, id))?;
            Ok((CreatedActivity { id, created: now }, wrote))
        })
    }

    /// Updates an activity of the given type; returns its record id (after a move, the new one).
    pub fn update_activity(
        &self,
        viewer: &Viewer,
        kind: ActivityType,
        id: i64,
        changes: ActivityChanges,
    ) -> Result<i64> {
        self.write_emitting(|tx| {
            let node = load_node(tx, viewer, id)?;
            if node.is_record || node.typeid != kind.typeid() {
                return Err(StoreError::NotFound);
            }
            let (current_parent, fields_text, current_position): (i64, String, i64) = tx
                .prepare_cached("SELECT parent, fields, position FROM items WHERE id = ?1")?
                .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            let mut fields = parse_fields(&fields_text);
            check_principals(tx, viewer, kind, &changes.fields, Some(&fields))?;
            let fields_before = fields.clone();
            merge_fields(&mut fields, &changes.fields);
            let mut moved = false;

            let mut parent_id = current_parent;
            let mut record_id = node.record_id;
            if let Some(target) = changes.parent.filter(|p| *p != current_parent) {
                let target_node = load_node(tx, viewer, target)?;
                check_parent(kind, &target_node)?;
                check_one_per_parent(tx, kind, target_node.id)?;
                let inside: Option<i64> = tx
                    .query_row(
                        "WITH RECURSIVE sub(id) AS (SELECT ?1 UNION ALL SELECT i.id FROM items i JOIN sub ON i.parent = sub.id)
                         SELECT id FROM sub WHERE id = ?2",
                        (id, target),
                        |r| r.get(0),
                    )
                    .optional()?;
                if inside.is_some() {
                    return Err(StoreError::WrongParent("an activity cannot be moved under itself".into()));
                }
                let shift = target_node.level + 1 - node.level;
                tx.exec(
                    "WITH RECURSIVE sub(id) AS (SELECT ?1 UNION ALL SELECT i.id FROM items i JOIN sub ON i.parent = sub.id)
                     UPDATE items SET record_id = ?2, level = level + ?3 WHERE id IN sub",
                    (id, target_node.record_id, shift),
                )?;
                parent_id = target_node.id;
                record_id = target_node.record_id;
                let position = position_for(tx, parent_id, changes.place, Some(id))?;
                tx.exec("UPDATE items SET parent = ?2, position = ?3 WHERE id = ?1", (id, parent_id, position))?;
                moved = true;
            } else if changes.place.is_some() {
                let position = position_for(tx, parent_id, changes.place, Some(id))?;
                tx.exec("UPDATE items SET position = ?2 WHERE id = ?1", (id, position))?;
                moved = position != current_position;
            }
            // An update that changes nothing (a client saving what it read) leaves `updated`
            // where it was and tells no hook, as for records.
            if !moved && fields == fields_before && changes.upload.is_none() {
                return Ok((record_id, false));
            }

            let title = kind.title(&fields);
            tx.exec(
                "UPDATE items SET name = ?2, fields = ?3, search = ?4, due = ?5, completed = ?6, updated = CASE WHEN ?9 >= updated THEN ?9 ELSE updated + 1 END,
                                  modificator = ?8,
                                  completed_at = CASE WHEN NOT ?6 THEN NULL WHEN completed = 0 THEN ?7
                                                      ELSE completed_at END
                 WHERE id = ?1",
                (
                    id,
                    &title,
                    fields_json(&fields),
                    search_text(&title, &fields),
                    kind.date(&fields),
                    ActivityType::completed(&fields),
                    now_secs(),
                    viewer.user_id,
                    super::records::updated_stamp(tx, now_secs())?,
                ),
            )?;
            match (&changes.upload, changes.fields.get("file")) {
                (Some(upload), _) => store_file(tx, id, upload)?,
                // Renamed: the download is named as Show says.
                (None, Some(name)) if !name.is_empty() => {
                    tx.exec("UPDATE files SET name = ?2 WHERE item_id = ?1", (id, name))?;
                }
                _ => {}
            }
            let wrote = self.emit(tx, &viewer.org, &[Event::ActivitiesUpdate], Target::Activity(kind, id))?;
            Ok((record_id, wrote))
        })
    }

    /// The file of a live activity of the given type the viewer may see.
    pub fn activity_file(&self, viewer: &Viewer, kind: ActivityType, id: i64) -> Result<FileContent> {
        self.read(|tx| {
            let node = load_node(tx, viewer, id)?;
            if node.is_record || node.typeid != kind.typeid() {
                return Err(StoreError::NotFound);
            }
            tx.prepare_cached("SELECT name, content_type, size, content FROM files WHERE item_id = ?1")?
                .query_row([id], |r| {
                    Ok(FileContent {
                        info: FileInfo { name: r.get(0)?, content_type: r.get(1)?, size: r.get(2)? },
                        content: r.get(3)?,
                    })
                })
                .optional()?
                .ok_or(StoreError::NotFound)
        })
    }

    /// Archives an activity and everything under it, together (soft delete); returns its
    /// record id.
    pub fn delete_activity(&self, viewer: &Viewer, kind: ActivityType, id: i64) -> Result<i64> {
        self.write_emitting(|tx| {
            let node = load_node(tx, viewer, id)?;
            if node.is_record || node.typeid != kind.typeid() {
                return Err(StoreError::NotFound);
            }
            let wrote = self.emit(tx, &viewer.org, &[Event::ActivitiesDelete], Target::Activity(kind, id))?;
            tx.exec(
                "WITH RECURSIVE sub(id) AS (SELECT ?1 UNION ALL SELECT i.id FROM items i JOIN sub ON i.parent = sub.id
                                             WHERE i.archived IS NULL)
                 UPDATE items SET archived = ?1, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3 WHERE id IN sub AND archived IS NULL",
                (id, super::records::updated_stamp(tx, now_secs())?, viewer.user_id),
            )?;
            Ok((node.record_id, wrote))
        })
    }

    /// Brings back a deleted activity with what its deletion archived; its record must be
    /// live.
    pub fn restore_activity(&self, viewer: &Viewer, kind: ActivityType, id: i64) -> Result<()> {
        self.write_emitting(|tx| {
            let row: Option<(i64, i64, i64, i64)> = tx
                .query_row(
                    "SELECT a.typeid, r.ownership, a.parent, a.record_id FROM items a JOIN items r ON r.id = a.record_id
                     WHERE a.id = ?1 AND a.org = ?2 AND a.parent IS NOT NULL AND a.archived = a.id
                       AND r.archived IS NULL",
                    (id, &viewer.org),
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()?;
            let Some((typeid, ownership, parent, record_id)) = row else { return Err(StoreError::NotFound) };
            if typeid != kind.typeid() || (!viewer.admin && !viewer.owner_ids().contains(&ownership)) {
                return Err(StoreError::NotFound);
            }
            // Its parent must be live again too (restore the parent first), without another of
            // a type it may hold one of (made while this one was deleted).
            load_node(tx, viewer, parent)?;
            check_one_per_parent(tx, kind, parent)?;
            // It comes back at its place: a sibling made there meanwhile, and those after it,
            // move one on.
            tx.exec(
                "UPDATE items SET position = position + 1
                 WHERE parent = ?1 AND archived IS NULL
                   AND position >= (SELECT position FROM items WHERE id = ?2)
                   AND EXISTS (SELECT 1 FROM items s WHERE s.parent = ?1 AND s.archived IS NULL
                               AND s.position = (SELECT position FROM items WHERE id = ?2))",
                (parent, id),
            )?;
            // What its deletion archived lies under the same record (its activities' index).
            tx.exec(
                "UPDATE items SET archived = NULL, updated = CASE WHEN ?2 >= updated THEN ?2 ELSE updated + 1 END, modificator = ?3
                 WHERE record_id = ?4 AND parent IS NOT NULL AND archived = ?1",
                (id, super::records::updated_stamp(tx, now_secs())?, viewer.user_id, record_id),
            )?;
            let wrote = self.emit(tx, &viewer.org, &[Event::ActivitiesRestore], Target::Activity(kind, id))?;
            Ok(((), wrote))
        })
    }
}
