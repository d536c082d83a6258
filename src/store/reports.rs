//! Activity reports: one query shape over activities, joined to their parent and root record,
//! narrowed by the conditions a report asks for. Only activities of live records the viewer
//! may see are reported.

use std::collections::HashMap;

use rusqlite::ToSql;
use rusqlite::types::Value;

use super::principals::owner_ids_json;
use super::records::{AUDIT_JOINS, RECORD_COLUMNS, RecordRow, bind, matches_total, record_from_row};
use super::{Result, Store, answer_fields, json_ids};
use crate::model::{FieldValues, Viewer};

/// Who an activity must be assigned to (its assignee field: `assignedto`, `responsible`,
/// `person`).
#[derive(Clone, Debug)]
pub enum Assignee {
    Anyone,
    NoOne,
    Ids(Vec<i64>),
}

/// Conditions on the activity's date (`items.due`, YYYY-MM-DD).
#[derive(Clone, Debug)]
pub enum DateCondition {
    OnOrBefore(String),
    Between(String, String),
    NoDate,
}

/// Conditions on a time stamp (Unix seconds, half-open range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    Created,
    Updated,
    /// Created or updated.
    Changed,
    Completed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Billing {
    Invoiced,
    Billable,
    NonBillable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportOrder {
    /// By date (undated last), then id.
    Date,
    /// Most recently created or changed first.
    Recent,
}

#[derive(Clone, Debug)]
pub struct ReportQuery {
    pub typeids: Vec<i64>,
    /// Only activities not completed.
    pub open_only: bool,
    /// The field that names the assignee, and who it must be.
    pub assignee: Option<(&'static str, Assignee)>,
    /// Milestones (task lists) have no assignee: they match `Anyone` and `NoOne` only.
    pub date: Option<DateCondition>,
    pub statuses: Vec<String>,
    pub stamp: Option<(Stamp, i64, i64)>,
    /// Creator or modificator (by `stamp`), user ids (groups already expanded).
    pub users: Option<Vec<i64>>,
    pub categories: Vec<i64>,
    pub itemtypes: Vec<i64>,
    pub billing: Option<Billing>,
    /// Activities of these types are reported only when they have a date.
    pub dated_typeids: Vec<i64>,
    pub order: ReportOrder,
    pub limit: u32,
    pub start: u64,
}

/// One reported activity with what the reports show of its surroundings.
#[derive(Clone, Debug)]
pub struct ReportRow {
    pub id: i64,
    pub typeid: i64,
    pub name: String,
    pub fields: FieldValues,
    pub date: Option<String>,
    pub completed: bool,
    pub created: i64,
    pub updated: i64,
    pub creator: i64,
    pub parent_id: i64,
    pub parent_typeid: i64,
    pub parent_name: String,
    pub grandparent: Option<(i64, i64, String)>,
    pub record_id: i64,
    pub record_typeid: i64,
    pub record_name: String,
    pub record_ownership: i64,
    pub comments: i64,
}

impl Store {
    /// The matching activities (one page) and how many match in all.
    pub fn report(&self, viewer: &Viewer, q: &ReportQuery) -> Result<(Vec<ReportRow>, u64)> {
        self.read(|tx| {
            let mut params: Vec<(&'static str, Value)> = vec![
                (":org", Value::Text(viewer.org.clone())),
                (":typeids", Value::Text(json_ids(&q.typeids))),
            ];
            let mut cond = vec![
                "a.org = :org".to_string(),
                "a.parent IS NOT NULL".to_string(),
                "a.archived IS NULL".to_string(),
                "r.archived IS NULL".to_string(),
                "a.typeid IN (SELECT value FROM json_each(:typeids))".to_string(),
            ];
            if !viewer.admin {
                params.push((":owners", Value::Text(owner_ids_json(viewer))));
                cond.push("r.ownership IN (SELECT value FROM json_each(:owners))".into());
            }
            if q.open_only {
                cond.push("a.completed = 0".into());
            }
            if let Some((field, who)) = &q.assignee {
                let expr = format!("coalesce(json_extract(a.fields, '$.{field}'), '')");
                match who {
                    Assignee::Anyone => {}
                    Assignee::NoOne => cond.push(format!("{expr} = ''")),
                    Assignee::Ids(ids) => {
                        params.push((":assignees", Value::Text(json_ids(ids))));
                        cond.push(format!(
                            "{expr} <> '' AND CAST({expr} AS INTEGER) IN (SELECT value FROM json_each(:assignees))"
                        ));
                    }
                }
            }
            match &q.date {
                None => {}
                Some(DateCondition::OnOrBefore(d)) => {
                    params.push((":date_to", Value::Text(d.clone())));
                    cond.push("a.due IS NOT NULL AND a.due <= :date_to".into());
                }
                Some(DateCondition::Between(from, to)) => {
                    params.push((":date_from", Value::Text(from.clone())));
                    params.push((":date_to", Value::Text(to.clone())));
                    cond.push("a.due BETWEEN :date_from AND :date_to".into());
                }
                Some(DateCondition::NoDate) => cond.push("a.due IS NULL".into()),
            }
            if !q.statuses.is_empty() {
                params.push((":statuses", Value::Text(serde_json::to_string(&q.statuses).unwrap_or_default())));
                cond.push(
                    "lower(coalesce(json_extract(a.fields, '$.status'), '')) IN (SELECT value FROM json_each(:statuses))"
                        .into(),
                );
            }
            if let Some((stamp, from, to)) = q.stamp {
                params.push((":from", Value::Integer(from)));
                params.push((":to", Value::Integer(to)));
                cond.push(
                    match stamp {
                        Stamp::Created => "a.created >= :from AND a.created < :to",
                        Stamp::Updated => "a.updated >= :from AND a.updated < :to AND a.updated > a.created",
                        Stamp::Changed => {
                            "((a.created >= :from AND a.created < :to) OR (a.updated >= :from AND a.updated < :to))"
                        }
                        Stamp::Completed => "a.completed = 1 AND a.completed_at >= :from AND a.completed_at < :to",
                    }
                    .into(),
                );
            }
            if let Some(users) = &q.users {
                params.push((":users", Value::Text(json_ids(users))));
                let by = match q.stamp.map(|s| s.0) {
                    Some(Stamp::Created) => "a.creator IN (SELECT value FROM json_each(:users))",
                    Some(Stamp::Updated | Stamp::Completed) => "a.modificator IN (SELECT value FROM json_each(:users))",
                    _ => {
                        "(a.creator IN (SELECT value FROM json_each(:users)) \
                         OR a.modificator IN (SELECT value FROM json_each(:users)))"
                    }
                };
                cond.push(by.into());
            }
            if !q.categories.is_empty() {
                params.push((":categories", Value::Text(json_ids(&q.categories))));
                cond.push(
                    "EXISTS (SELECT 1 FROM item_categories ic WHERE ic.item_id = r.id \
                     AND ic.category_id IN (SELECT value FROM json_each(:categories)))"
                        .into(),
                );
            }
            if !q.itemtypes.is_empty() {
                params.push((":itemtypes", Value::Text(json_ids(&q.itemtypes))));
                cond.push("r.typeid IN (SELECT value FROM json_each(:itemtypes))".into());
            }
            match q.billing {
                None => {}
                Some(Billing::Invoiced) => cond.push("coalesce(json_extract(a.fields, '$.invoiced'), '') <> ''".into()),
                Some(Billing::Billable) => cond.push("json_extract(a.fields, '$.billable') = '1'".into()),
                Some(Billing::NonBillable) => {
                    cond.push("coalesce(json_extract(a.fields, '$.billable'), '0') <> '1'".into())
                }
            }
            if !q.dated_typeids.is_empty() {
                params.push((":dated", Value::Text(json_ids(&q.dated_typeids))));
                cond.push("(a.due IS NOT NULL OR a.typeid NOT IN (SELECT value FROM json_each(:dated)))".into());
            }
            let where_sql = cond.join(" AND ");
            let order = match q.order {
                ReportOrder::Date => "a.due IS NULL, a.due, a.id",
                // `updated` is never before `created`: the latest change first.
                ReportOrder::Recent => "a.updated DESC, a.id DESC",
            };
            // The page's ids first, then its rows (as lists do: every match's row, parents and
            // comment count went through the sorter before the page was cut out of it).
            let sql = format!(
                "SELECT a.id, a.typeid, a.name, a.fields, a.due, a.completed, a.created, a.updated, a.creator,
                        p.id, p.typeid, p.name, gp.id, gp.typeid, gp.name, r.id, r.typeid, r.name, r.ownership,
                        (SELECT count(*) FROM items c WHERE c.parent = a.id AND c.typeid = 91 AND c.archived IS NULL)
                 FROM (SELECT a.id FROM items a JOIN items r ON r.id = a.record_id WHERE {where_sql}
                       ORDER BY {order} LIMIT :limit OFFSET :start) AS page
                      JOIN items a ON a.id = page.id JOIN items p ON p.id = a.parent JOIN items r ON r.id = a.record_id
                      LEFT JOIN items gp ON gp.id = p.parent
                 ORDER BY {order}"
            );
            params.push((":limit", Value::Integer(i64::from(q.limit))));
            params.push((":start", Value::Integer(i64::try_from(q.start).unwrap_or(i64::MAX))));
            let mut stmt = tx.prepare_cached(&sql)?;
            let bound: Vec<(&str, &dyn ToSql)> = bind(&stmt, &params);
            let rows = stmt
                .query_map(bound.as_slice(), |r| {
                    let gp_id: Option<i64> = r.get(12)?;
                    Ok(ReportRow {
                        id: r.get(0)?,
                        typeid: r.get(1)?,
                        name: r.get(2)?,
                        fields: answer_fields(&r.get::<_, String>(3)?)?,
                        date: r.get(4)?,
                        completed: r.get(5)?,
                        created: r.get(6)?,
                        updated: r.get(7)?,
                        creator: r.get(8)?,
                        parent_id: r.get(9)?,
                        parent_typeid: r.get(10)?,
                        parent_name: r.get(11)?,
                        grandparent: match gp_id {
                            Some(id) => Some((id, r.get(13)?, r.get(14)?)),
                            None => None,
                        },
                        record_id: r.get(15)?,
                        record_typeid: r.get(16)?,
                        record_name: r.get(17)?,
                        record_ownership: r.get(18)?,
                        comments: r.get(19)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let count = matches_total(q.start, q.limit, rows.len(), || {
                let sql = format!("SELECT count(*) FROM items a JOIN items r ON r.id = a.record_id WHERE {where_sql}");
                let mut stmt = tx.prepare_cached(&sql)?;
                let bound = bind(&stmt, &params);
                Ok(stmt.query_row(bound.as_slice(), |r| r.get(0))?)
            })?;
            Ok((rows, count))
        })
    }

    /// Live records by id, for reports with `itemsdata=1` (the caller already knows they are
    /// visible: they are the roots of reported activities).
    pub fn records_by_ids(&self, viewer: &Viewer, ids: &[i64]) -> Result<HashMap<i64, RecordRow>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT {RECORD_COLUMNS} FROM items i {AUDIT_JOINS}
                 WHERE i.id IN (SELECT value FROM json_each(?1)) AND i.org = ?2 AND i.parent IS NULL"
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let rows = stmt.query_map((json_ids(ids), &viewer.org), record_from_row)?;
            let mut out = HashMap::new();
            for row in rows {
                let row = row?;
                out.insert(row.id, row);
            }
            Ok(out)
        })
    }

    /// Display names of every user and group of the organisation (deleted ones too), for
    /// `cn` attributes.
    pub fn principal_names(&self, org: &str) -> Result<HashMap<i64, String>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached("SELECT id, name FROM principals WHERE org = ?1")?;
            let rows = stmt.query_map([org], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<HashMap<i64, String>>>()?)
        })
    }

    /// User ids for a mix of user and group ids: groups stand for their members.
    pub fn expand_groups(&self, org: &str, ids: &[i64]) -> Result<Vec<i64>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT p.id FROM principals p WHERE p.org = ?2 AND p.kind = 1 AND p.id IN (SELECT value FROM json_each(?1))
                 UNION
                 SELECT m.user_id FROM memberships m JOIN principals g ON g.id = m.group_id
                 WHERE g.org = ?2 AND m.group_id IN (SELECT value FROM json_each(?1))",
            )?;
            let rows = stmt.query_map((json_ids(ids), org), |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<i64>>>()?)
        })
    }
}
