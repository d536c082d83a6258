//! Activity reports: `/report/nextactions`, `/report/followups`, `/report/opportunities`,
//! `/report/activities`, `/report/timetracking`, `/report/calendar`. Parameters come from the
//! query string or a body; every report lists only what the caller may see.

use std::collections::HashMap;

use jiff::civil::Date;
use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, id_list, name_list};
use super::output::Out;
use super::records::item_out;
use super::{Ctx, Reply};
use crate::limits;
use crate::model::activity::{ActivityType, DEAL_STATUSES};
use crate::model::{Kind, RecordType};
use crate::store::{Assignee, Billing, DateCondition, ReportOrder, ReportQuery, ReportRow, Stamp};
use crate::timefmt;

/// Type ids the reports accept in `types`: every activity type, and the deployed service's
/// event (4), non-linked event (61) and scheduled e-mail (88), which no activity here has.
const EXTRA_TYPEIDS: &[i64] = &[4, 61, 88];
const TASK: i64 = 14;
const FOLLOWUP: i64 = 6;
const TASKLIST: i64 = 22;
const DEAL: i64 = 32;
const TIMERECORD: i64 = 15;

struct Common<'a> {
    ctx: &'a Ctx<'a>,
    params: Value,
    names: HashMap<i64, String>,
}

impl<'a> Common<'a> {
    fn new(ctx: &'a Ctx<'a>) -> Result<Common<'a>, ApiError> {
        let names = ctx.app.store.principal_names(&ctx.viewer.org)?;
        Ok(Common { ctx, params: ctx.params(), names })
    }

    fn p(&self) -> Params<'_> {
        Params::new(&self.params)
    }

    fn today(&self) -> Date {
        timefmt::today(&self.ctx.app.config.site.timezone)
    }

    /// `limit` (default 500, at most 5000) and `offset` (`start` is a date in these reports).
    fn paging(&self) -> Result<(u32, u64), ApiError> {
        self.paging_by(&["offset"])
    }

    /// Paging where `start` is no date: a client pages these as it pages record lists, by
    /// `start` (an offset there) until it has `count` rows; `offset` works too.
    fn paging_or_start(&self) -> Result<(u32, u64), ApiError> {
        self.paging_by(&["offset", "start"])
    }

    fn paging_by(&self, offset_keys: &[&str]) -> Result<(u32, u64), ApiError> {
        let p = self.p();
        let limit =
            p.page_size("limit", 0, i64::from(limits::REPORT_ROWS_MAX), i64::from(limits::REPORT_ROWS_DEFAULT))? as u32;
        let mut offset = 0;
        for key in offset_keys {
            match p.int(key)? {
                None => {}
                Some(n) if n >= 0 => {
                    offset = n as u64;
                    break;
                }
                Some(n) => return Err(ApiError::invalid_parameter(key, format!("{n} is negative"))),
            }
        }
        Ok((limit, offset))
    }

    /// A user/group parameter: missing or empty is anyone, `0` no one, else the ids.
    fn assignee(&self, key: &str) -> Result<Assignee, ApiError> {
        let Some(v) = self.p().get(key).filter(|v| !matches!(v, Value::Null)) else { return Ok(Assignee::Anyone) };
        let names = name_list(v, key)?;
        if names.is_empty() {
            return Ok(Assignee::Anyone);
        }
        if names.len() == 1 && names[0] == "0" {
            return Ok(Assignee::NoOne);
        }
        Ok(Assignee::Ids(id_list(v, key)?))
    }

    /// `due`: now, next7, next30 (everything open due by then, overdue included), nodate, or
    /// `from,to` (dates, inclusive).
    fn due(&self) -> Result<Option<DateCondition>, ApiError> {
        let Some(due) = self.p().nonempty("due")? else { return Ok(None) };
        let today = self.today();
        let ahead = |days: i64| today.checked_add(jiff::Span::new().days(days)).unwrap_or(today).to_string();
        Ok(Some(match due.to_ascii_lowercase().as_str() {
            "now" => DateCondition::OnOrBefore(today.to_string()),
            "next7" => DateCondition::OnOrBefore(ahead(7)),
            "next30" => DateCondition::OnOrBefore(ahead(30)),
            "nodate" => DateCondition::NoDate,
            _ => {
                let (from, to) = date_range(&due, "due")?;
                DateCondition::Between(from.to_string(), to.to_string())
            }
        }))
    }

    /// `start` and `end` dates (inclusive); each defaults as given.
    fn dates(&self, default_start: Date, default_end: Date) -> Result<(Date, Date), ApiError> {
        let p = self.p();
        let date = |key: &str| -> Result<Option<Date>, ApiError> {
            p.nonempty(key)?
                .map(|v| {
                    timefmt::parse_local_date(&v, &self.ctx.app.config.site.timezone)
                        .ok_or_else(|| ApiError::invalid_parameter(key, format!("{v:?} is not a date (YYYY-MM-DD)")))
                })
                .transpose()
        };
        // One bound given beyond the other's default: the other keeps the default span from
        // it (a start after the default end ends a span after it; an end before the default
        // start begins a span before it).
        let span = default_start.until(default_end).unwrap_or_default();
        let (start, end) = match (date("start")?, date("end")?) {
            (Some(start), Some(end)) => (start, end),
            (Some(start), None) if start > default_end => (start, start.checked_add(span).unwrap_or(start)),
            (Some(start), None) => (start, default_end),
            (None, Some(end)) if end < default_start => (end.checked_sub(span).unwrap_or(end), end),
            (None, Some(end)) => (default_start, end),
            (None, None) => (default_start, default_end),
        };
        if start > end {
            return Err(ApiError::invalid_parameter("end", "is before start"));
        }
        Ok((start, end))
    }

    /// The half-open range of Unix seconds the dates cover, in the site's time zone.
    fn day_span(&self, start: Date, end: Date) -> (i64, i64) {
        let tz = &self.ctx.app.config.site.timezone;
        // A day past what the time library holds (9999-12-31 as "no end") is the end of time,
        // not the start of it: the range was empty.
        let at = |d: Date, beyond: i64| d.to_zoned(tz.clone()).map_or(beyond, |z| z.timestamp().as_second());
        let after_end = end.checked_add(jiff::Span::new().days(1)).ok();
        (at(start, i64::MIN), after_end.map_or(i64::MAX, |d| at(d, i64::MAX)))
    }

    fn itemtypes(&self) -> Result<Vec<i64>, ApiError> {
        let Some(v) = self.p().get("itemtypes") else { return Ok(Vec::new()) };
        let ids = id_list(v, "itemtypes")?;
        if let Some(bad) = ids.iter().find(|t| RecordType::from_typeid(**t).is_none()) {
            return Err(ApiError::invalid_parameter("itemtypes", format!("{bad} is not 1, 2, 40 or 50")));
        }
        Ok(ids)
    }

    fn itemsdata(&self) -> Result<bool, ApiError> {
        Ok(self.p().flag("itemsdata")?.unwrap_or(false))
    }

    fn run(&self, q: &ReportQuery) -> Result<(Vec<ReportRow>, u64), ApiError> {
        Ok(self.ctx.app.store.report(&self.ctx.viewer, q)?)
    }

    /// The root records of the rows, when `itemsdata=1`.
    fn items(&self, rows: &[ReportRow], wanted: bool) -> Result<Items, ApiError> {
        if !wanted || rows.is_empty() {
            return Ok(Items(HashMap::new()));
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.record_id).collect();
        let records = self.ctx.app.store.records_by_ids(&self.ctx.viewer, &ids)?;
        Ok(Items(
            records
                .into_iter()
                .map(|(id, r)| {
                    let bytes = r.name.len() + r.fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
                    (id, (item_out(&self.ctx.app.config.fields, r), bytes))
                })
                .collect(),
        ))
    }

    /// A principal id with its display name as the `cn` attribute.
    fn push_principal(&self, out: &mut Out, name: &'static str, id: &str) {
        let cn = id.parse::<i64>().ok().and_then(|i| self.names.get(&i)).cloned().unwrap_or_default();
        out.push_attr(name, "cn", cn, Out::text(id));
    }

    /// Every field of the activity's type; user and group ids carry `cn`.
    fn fields(&self, row: &ReportRow) -> Out {
        let mut fields = Out::map();
        match ActivityType::from_typeid(row.typeid) {
            Some(kind) => {
                for f in kind.fields() {
                    let value = row.fields.get(f.name).cloned().unwrap_or_default();
                    if f.kind == Kind::Principal {
                        self.push_principal(&mut fields, f.name, &value);
                    } else {
                        fields.push(f.name, Out::text(value));
                    }
                }
            }
            None => {
                for (k, v) in &row.fields {
                    fields.push(k.clone(), Out::text(v.clone()));
                }
            }
        }
        fields
    }

    /// An activity's date: its due date, or for an interaction the day it occurred in the
    /// site's time zone (its `dateoccured` is kept in UTC; the stored date, which orders it,
    /// is the UTC day).
    fn date_of(&self, row: &ReportRow) -> String {
        let occurred = (ActivityType::from_typeid(row.typeid) == Some(ActivityType::Call))
            .then(|| row.fields.get("dateoccured").and_then(|v| timefmt::parse_datetime(v)))
            .flatten()
            .and_then(|secs| jiff::Timestamp::from_second(secs).ok());
        match occurred {
            Some(ts) => ts.to_zoned(self.ctx.app.config.site.timezone.clone()).date().to_string(),
            None => row.date.clone().unwrap_or_default(),
        }
    }

    /// The entry of an activity in nextactions, followups, calendar and activities.
    fn entry(&self, row: &ReportRow, items: &Items) -> Result<Out, ApiError> {
        let mut out = Out::map()
            .with("id", Out::Int(row.id))
            .with("typeid", Out::Int(row.typeid))
            .with("name", Out::text(row.name.clone()))
            .with("date", Out::text(self.date_of(row)))
            .with("completed", Out::Int(i64::from(row.completed)))
            .with("comments", Out::Int(row.comments))
            .with("parent", Out::Int(row.parent_id))
            .with("parenttypeid", Out::Int(row.parent_typeid))
            .with("parentname", Out::text(row.parent_name.clone()))
            .with("itemid", Out::Int(row.record_id))
            .with("itemtype", Out::Int(row.record_typeid))
            .with("itemname", Out::text(row.record_name.clone()))
            .with("created", Out::Time(row.created))
            .with("updated", Out::Time(row.updated))
            .with("fields", self.fields(row));
        if let Some(item) = items.of(row.record_id)? {
            out.push("item", item);
        }
        Ok(out)
    }

    /// A report of activity entries (nextactions, followups, activities, calendar).
    fn activity_list(&self, q: &ReportQuery, list: &'static str, item: &'static str) -> Result<Reply, ApiError> {
        let (rows, count) = self.run(q)?;
        let items = self.items(&rows, self.itemsdata()?)?;
        let entries = rows.iter().map(|r| self.entry(r, &items)).collect::<Result<_, _>>()?;
        Ok(self.doc(list, item, entries, count))
    }

    fn doc(&self, list: &'static str, item: &'static str, entries: Vec<Out>, count: u64) -> Reply {
        Reply::ok(
            Out::map()
                .with(list, Out::list(item, entries))
                .with("count", Out::Int(i64::try_from(count).unwrap_or(i64::MAX))),
        )
    }
}

/// `a,b` as two dates, the first not after the second.
fn date_range(text: &str, key: &str) -> Result<(Date, Date), ApiError> {
    let bad = || {
        ApiError::invalid_parameter(key, format!("{text:?} is not now, next7, next30, nodate or two dates (from,to)"))
    };
    let (a, b) = text.split_once(',').ok_or_else(bad)?;
    // Plain dates only, as documented (parse_date also takes a date and time).
    let date = |s: &str| Some(crate::model::trim_blank(s)).filter(|s| s.len() == 10).and_then(timefmt::parse_date);
    let (from, to) = (date(a).ok_or_else(bad)?, date(b).ok_or_else(bad)?);
    if from > to {
        return Err(bad());
    }
    Ok((from, to))
}

fn query(typeids: Vec<i64>, order: ReportOrder, (limit, start): (u32, u64)) -> ReportQuery {
    ReportQuery {
        typeids,
        open_only: false,
        assignee: None,
        date: None,
        statuses: Vec::new(),
        stamp: None,
        users: None,
        categories: Vec::new(),
        itemtypes: Vec::new(),
        billing: None,
        dated_typeids: Vec::new(),
        order,
        limit,
        start,
    }
}

/// Open tasks and milestones (dated task lists). `filter` is the task's assignee; milestones
/// have none.
pub fn nextactions(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let mut q = query(vec![TASK, TASKLIST, 4], ReportOrder::Date, c.paging_or_start()?);
    q.open_only = true;
    q.assignee = Some(("assignedto", c.assignee("filter")?));
    q.date = c.due()?;
    // A task list is a milestone only when it has a date.
    q.dated_typeids = vec![TASKLIST];
    c.activity_list(&q, "nextactions", "nextaction")
}

/// Open follow-ups; `responsible` is the follow-up's assignee.
pub fn followups(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let mut q = query(vec![FOLLOWUP], ReportOrder::Date, c.paging_or_start()?);
    q.open_only = true;
    q.assignee = Some(("assignedto", c.assignee("responsible")?));
    q.date = c.due()?;
    c.activity_list(&q, "followups", "followup")
}

/// Deals: `filter` is the deal's responsible user or group, `status` its status (lower case,
/// several comma-separated), `due` its closing date.
pub fn opportunities(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let mut q = query(vec![DEAL], ReportOrder::Date, c.paging_or_start()?);
    q.assignee = Some(("responsible", c.assignee("filter")?));
    q.date = c.due()?;
    if let Some(v) = c.p().get("status") {
        for s in name_list(v, "status")? {
            let s = s.to_ascii_lowercase();
            if !DEAL_STATUSES.iter().any(|d| d.eq_ignore_ascii_case(&s)) {
                return Err(ApiError::invalid_parameter(
                    "status",
                    format!("{s:?} is not discussion, pending, won, lost or on-hold"),
                ));
            }
            q.statuses.push(s);
        }
    }
    let (rows, count) = c.run(&q)?;
    let items = c.items(&rows, c.itemsdata()?)?;
    let entries = rows
        .iter()
        .map(|r| -> Result<Out, ApiError> {
            let f = |k: &str| Out::text(r.fields.get(k).cloned().unwrap_or_default());
            let mut out = Out::map()
                .with("id", Out::Int(r.id))
                .with("description", f("description"))
                .with("status", f("status"))
                .with("stage", f("stage"))
                .with("owner", Out::Int(r.record_ownership))
                .with("valueunit", f("valueunit"))
                .with("valuecurrency", f("valuecurrency"))
                .with("valueinterval", f("valueinterval"))
                .with("probability", f("probability"))
                .with("created", Out::Time(r.created))
                .with("modified", Out::Time(r.updated))
                .with("closingdate", f("closingdate"))
                .with("itemtype", Out::Int(r.record_typeid))
                .with("itemid", Out::Int(r.record_id))
                .with("itemname", Out::text(r.record_name.clone()));
            c.push_principal(&mut out, "responsible", r.fields.get("responsible").map(String::as_str).unwrap_or(""));
            if let Some(item) = items.of(r.record_id)? {
                out.push("item", item);
            }
            Ok(out)
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(c.doc("opportunities", "opportunity", entries, count))
}

/// Activities created, changed or (tasks) completed between `start` and `end`.
pub fn activities(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let p = c.p();
    let today = c.today();
    let (start, end) = c.dates(today.checked_sub(jiff::Span::new().days(30)).unwrap_or(today), today)?;
    let (from, to) = c.day_span(start, end);
    let stamp = match p.nonempty("last")?.map(|s| s.to_ascii_lowercase()).as_deref() {
        None | Some("changed") => Stamp::Changed,
        Some("created") => Stamp::Created,
        Some("updated") => Stamp::Updated,
        Some("completed") => Stamp::Completed,
        Some(other) => {
            return Err(ApiError::invalid_parameter(
                "last",
                format!("{other:?} is not created, updated, changed or completed"),
            ));
        }
    };
    // Sent empty (`types=`, `<types/>`): as left out, as every parameter is.
    let types = p.get("types").map(|v| id_list(v, "types")).transpose()?.filter(|ids| !ids.is_empty());
    let typeids = match types {
        None => ActivityType::ALL.iter().map(|t| t.typeid()).collect(),
        Some(ids) => {
            if let Some(bad) =
                ids.iter().find(|t| ActivityType::from_typeid(**t).is_none() && !EXTRA_TYPEIDS.contains(t))
            {
                return Err(ApiError::invalid_parameter("types", format!("{bad} is not an activity type id")));
            }
            ids
        }
    };
    let mut q = query(typeids, ReportOrder::Recent, c.paging()?);
    q.stamp = Some((stamp, from, to));
    if let Some(v) = p.get("users") {
        let ids = id_list(v, "users")?;
        if !ids.is_empty() {
            q.users = Some(ctx.app.store.expand_groups(&ctx.viewer.org, &ids)?);
        }
    }
    if let Some(v) = p.get("categories") {
        q.categories = id_list(v, "categories")?;
    }
    q.itemtypes = c.itemtypes()?;
    c.activity_list(&q, "activities", "activity")
}

/// Time records dated between `start` and `end`; `filter` invoiced, billable or non-billable.
pub fn timetracking(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let today = c.today();
    let (start, end) = c.dates(today.checked_sub(jiff::Span::new().days(30)).unwrap_or(today), today)?;
    let mut q = query(vec![TIMERECORD], ReportOrder::Date, c.paging()?);
    q.date = Some(DateCondition::Between(start.to_string(), end.to_string()));
    q.billing = match c.p().nonempty("filter")?.map(|s| s.to_ascii_lowercase()).as_deref() {
        None => None,
        Some("invoiced") => Some(Billing::Invoiced),
        Some("billable") => Some(Billing::Billable),
        Some("non-billable") => Some(Billing::NonBillable),
        Some(other) => {
            return Err(ApiError::invalid_parameter(
                "filter",
                format!("{other:?} is not invoiced, billable or non-billable"),
            ));
        }
    };
    q.itemtypes = c.itemtypes()?;
    let (rows, count) = c.run(&q)?;
    let items = c.items(&rows, c.itemsdata()?)?;
    let entries = rows
        .iter()
        .map(|r| -> Result<Out, ApiError> {
            let f = |k: &str| Out::text(r.fields.get(k).cloned().unwrap_or_default());
            // Under a task: the task and its task list; under an interaction: neither.
            let (task, tasklist) = if r.parent_typeid == TASK {
                let list = r.grandparent.clone().filter(|(_, t, _)| *t == TASKLIST);
                (
                    (r.parent_id, r.parent_name.clone()),
                    list.map(|(id, _, name)| (id, name)).unwrap_or((0, String::new())),
                )
            } else {
                ((0, String::new()), (0, String::new()))
            };
            let mut out = Out::map()
                .with("id", Out::Int(r.id))
                .with("type", Out::Int(r.parent_typeid))
                .with("itemid", Out::Int(r.record_id))
                .with("itemtype", Out::Int(r.record_typeid))
                .with("tasklistid", Out::Int(tasklist.0))
                .with("taskid", Out::Int(task.0))
                .with("owner", Out::Int(r.creator))
                .with("created", Out::Time(r.created))
                .with("billable", f("billable"));
            c.push_principal(&mut out, "person", r.fields.get("person").map(String::as_str).unwrap_or(""));
            out.push("hours", Out::decimal(r.fields.get("hours").map_or("", String::as_str)));
            out.push("date", f("date"));
            out.push("invoiced", f("invoiced"));
            out.push("details", f("details"));
            out.push("itemname", Out::text(r.record_name.clone()));
            out.push("tasklistname", Out::text(tasklist.1));
            out.push("taskname", Out::text(task.1));
            if let Some(item) = items.of(r.record_id)? {
                out.push("item", item);
            }
            Ok(out)
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(c.doc("timerecords", "timerecord", entries, count))
}

/// Tasks, follow-ups and events with a date from `start` through `end`, done or not. `filter`
/// is the assignee, as in nextactions and followups (0: none).
pub fn calendar(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let c = Common::new(ctx)?;
    let today = c.today();
    let (start, end) = c.dates(today, today.checked_add(jiff::Span::new().days(30)).unwrap_or(today))?;
    let mut q = query(vec![TASK, FOLLOWUP, 4], ReportOrder::Date, c.paging()?);
    q.assignee = Some(("assignedto", c.assignee("filter")?));
    q.date = Some(DateCondition::Between(start.to_string(), end.to_string()));
    c.activity_list(&q, "calendar", "entry")
}

/// The root records of a report's rows (`itemsdata=1`), each with the bytes of its fields.
struct Items(HashMap<i64, (Out, usize)>);

impl Items {
    /// A copy of the record for one more row, charged to the answer's budget: a record that
    /// many rows point at is in the answer as many times.
    fn of(&self, record_id: i64) -> Result<Option<Out>, ApiError> {
        match self.0.get(&record_id) {
            Some((item, bytes)) => {
                crate::store::charge_reply(*bytes)?;
                Ok(Some(item.clone()))
            }
            None => Ok(None),
        }
    }
}
