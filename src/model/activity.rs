//! Activity types: their path segments, type ids, fields and the hierarchy (which parent each
//! may sit under).

use super::FieldValues;
use super::value::Kind;

/// Every activity type the API creates, with the type id of the interface's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivityType {
    Attachment,
    Comment,
    Opportunity,
    File,
    Followup,
    Onlinedoc,
    Call,
    Linkedemails,
    Note,
    Photo,
    Photolist,
    Task,
    Tasklist,
    Timerecord,
    Website,
    Accountingwidget,
    Helpdeskwidget,
}

use ActivityType as A;

pub struct ActivityField {
    pub name: &'static str,
    pub kind: Kind,
}

const fn af(name: &'static str, kind: Kind) -> ActivityField {
    ActivityField { name, kind }
}

const ANY_INT: Kind = Kind::Int { min: i64::MIN, max: i64::MAX };
const NON_NEGATIVE: Kind = Kind::Int { min: 0, max: i64::MAX };
const PERCENT: Kind = Kind::Int { min: 0, max: 100 };
const PRIORITY: Kind = Kind::Int { min: 0, max: 6 };

pub const CURRENCIES: &[&str] = &[
    "USD", "EUR", "GBP", "CAD", "AUD", "BRL", "CHF", "CNY", "DKK", "HKD", "HRK", "HUF", "INR", "JPY", "MXN", "MYR",
    "NOK", "NZD", "RUB", "SEK", "SGD", "THB", "ZAR",
];
pub const VALUE_INTERVALS: &[&str] =
    &["fixed price", "per hour", "per day", "per week", "per month", "per quarter", "per year"];
pub const DEAL_STATUSES: &[&str] = &["Discussion", "Pending", "Won", "Lost", "On-hold"];
pub const TIME_MEASURES: &[&str] = &["days", "hours", "weeks"];

static ATTACHMENT: &[ActivityField] = &[af("file", Kind::File)];
static COMMENT: &[ActivityField] = &[af("post", Kind::Text)];
static OPPORTUNITY: &[ActivityField] = &[
    af("description", Kind::Text),
    af("valueunit", Kind::Decimal),
    af("valuecurrency", Kind::Choice(CURRENCIES)),
    af("valueinterval", Kind::Choice(VALUE_INTERVALS)),
    af("valueduration", NON_NEGATIVE),
    af("stage", PERCENT),
    af("probability", PERCENT),
    af("closingdate", Kind::Date),
    af("responsible", Kind::Principal),
    af("status", Kind::Choice(DEAL_STATUSES)),
];
static FILE: &[ActivityField] = &[af("caption", Kind::Text), af("file", Kind::File)];
static FOLLOWUP: &[ActivityField] = &[
    af("details", Kind::Text),
    af("assignedto", Kind::Principal),
    af("nodate", Kind::Flag),
    af("duedate", Kind::Date),
    af("completed", Kind::Flag),
    af("sendnotification", Kind::Flag),
    af("remindtime", NON_NEGATIVE),
];
static ONLINEDOC: &[ActivityField] = &[af("title", Kind::Text), af("url", Kind::Text)];
static CALL: &[ActivityField] =
    &[af("details", Kind::Text), af("dateoccured", Kind::DateTime), af("duration", NON_NEGATIVE)];
static LINKEDEMAILS: &[ActivityField] =
    &[af("fields", Kind::Text), af("keywords", Kind::Text), af("exceptions", Kind::Text)];
static NOTE: &[ActivityField] = &[af("details", Kind::Text)];
static PHOTO: &[ActivityField] = &[af("caption", Kind::Text), af("file", Kind::File)];
static PHOTOLIST: &[ActivityField] = &[af("title", Kind::Text)];
static TASK: &[ActivityField] = &[
    af("title", Kind::Text),
    af("details", Kind::Text),
    af("assignedto", Kind::Principal),
    af("nodate", Kind::Flag),
    af("duedate", Kind::Date),
    af("completed", Kind::Flag),
    af("sendnotification", Kind::Flag),
    af("remindtime", NON_NEGATIVE),
    af("priority", PRIORITY),
    af("billed", Kind::Flag),
    af("ignoreweekends", Kind::Flag),
    af("timespent", NON_NEGATIVE),
    af("timespentmeasure", Kind::Choice(TIME_MEASURES)),
    af("timeremains", NON_NEGATIVE),
    af("timeremainsmeasure", Kind::Choice(TIME_MEASURES)),
    af("invoiced", Kind::Text),
    af("notifyoncomplete", Kind::Emails),
];
static TASKLIST: &[ActivityField] = &[
    af("title", Kind::Text),
    af("description", Kind::Text),
    af("nodate", Kind::Flag),
    af("milestonedate", Kind::Date),
    af("completed", Kind::Flag),
];
static TIMERECORD: &[ActivityField] = &[
    af("date", Kind::Date),
    af("person", Kind::Principal),
    af("hours", Kind::Decimal),
    af("billable", Kind::Flag),
    af("details", Kind::Text),
    af("invoiced", Kind::Text),
];
static WEBSITE: &[ActivityField] = &[af("caption", Kind::Text), af("url", Kind::Text)];
static ACCOUNTINGWIDGET: &[ActivityField] = &[af("contactid", ANY_INT)];
static HELPDESKWIDGET: &[ActivityField] = &[af("userid", ANY_INT)];

/// Where an activity may be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentKind {
    Record,
    Activity(ActivityType),
}

impl ActivityType {
    pub const ALL: [ActivityType; 17] = [
        A::Attachment,
        A::Comment,
        A::Opportunity,
        A::File,
        A::Followup,
        A::Onlinedoc,
        A::Call,
        A::Linkedemails,
        A::Note,
        A::Photo,
        A::Photolist,
        A::Task,
        A::Tasklist,
        A::Timerecord,
        A::Website,
        A::Accountingwidget,
        A::Helpdeskwidget,
    ];

    pub fn segment(self) -> &'static str {
        match self {
            A::Attachment => "attachment",
            A::Comment => "comment",
            A::Opportunity => "opportunity",
            A::File => "file",
            A::Followup => "followup",
            A::Onlinedoc => "onlinedoc",
            A::Call => "call",
            A::Linkedemails => "linkedemails",
            A::Note => "note",
            A::Photo => "photo",
            A::Photolist => "photolist",
            A::Task => "task",
            A::Tasklist => "tasklist",
            A::Timerecord => "timerecord",
            A::Website => "website",
            A::Accountingwidget => "accountingwidget",
            A::Helpdeskwidget => "helpdeskwidget",
        }
    }

    pub fn typeid(self) -> i64 {
        match self {
            A::Attachment => 55,
            A::Comment => 91,
            A::Opportunity => 32,
            A::File => 23,
            A::Followup => 6,
            A::Onlinedoc => 37,
            A::Call => 73,
            A::Linkedemails => 90,
            A::Note => 3,
            A::Photo => 24,
            A::Photolist => 31,
            A::Task => 14,
            A::Tasklist => 22,
            A::Timerecord => 15,
            A::Website => 7,
            A::Accountingwidget => 96,
            A::Helpdeskwidget => 97,
        }
    }

    /// A human label, used as the title of an activity without a title-like field.
    pub fn label(self) -> &'static str {
        match self {
            A::Attachment => "Attached file",
            A::Comment => "Comment",
            A::Opportunity => "Deal",
            A::File => "File",
            A::Followup => "Follow-up",
            A::Onlinedoc => "Online document link",
            A::Call => "Interaction",
            A::Linkedemails => "Linked emails",
            A::Note => "Note",
            A::Photo => "Photo",
            A::Photolist => "Photo list",
            A::Task => "Task",
            A::Tasklist => "Task list",
            A::Timerecord => "Time record",
            A::Website => "Website",
            A::Accountingwidget => "Accounting widget",
            A::Helpdeskwidget => "Help-desk widget",
        }
    }

    pub fn from_segment(segment: &str) -> Option<ActivityType> {
        ActivityType::ALL.into_iter().find(|t| t.segment() == segment)
    }

    pub fn from_typeid(typeid: i64) -> Option<ActivityType> {
        ActivityType::ALL.into_iter().find(|t| t.typeid() == typeid)
    }

    pub fn fields(self) -> &'static [ActivityField] {
        match self {
            A::Attachment => ATTACHMENT,
            A::Comment => COMMENT,
            A::Opportunity => OPPORTUNITY,
            A::File => FILE,
            A::Followup => FOLLOWUP,
            A::Onlinedoc => ONLINEDOC,
            A::Call => CALL,
            A::Linkedemails => LINKEDEMAILS,
            A::Note => NOTE,
            A::Photo => PHOTO,
            A::Photolist => PHOTOLIST,
            A::Task => TASK,
            A::Tasklist => TASKLIST,
            A::Timerecord => TIMERECORD,
            A::Website => WEBSITE,
            A::Accountingwidget => ACCOUNTINGWIDGET,
            A::Helpdeskwidget => HELPDESKWIDGET,
        }
    }

    pub fn field(self, name: &str) -> Option<&'static ActivityField> {
        self.fields().iter().find(|f| f.name == name)
    }

    /// The parents this type may sit under: the supported hierarchies of the interface (written
    /// for contacts, they hold under every record type). Attachments, in no chain, may sit
    /// under a record or a comment.
    pub fn allowed_parents(self) -> &'static [ParentKind] {
        use ParentKind::{Activity as Act, Record};
        match self {
            A::Opportunity
            | A::Followup
            | A::Call
            | A::Linkedemails
            | A::Note
            | A::Photolist
            | A::Tasklist
            | A::Website
            | A::Accountingwidget
            | A::Helpdeskwidget => &[Record],
            A::File => &[Record, Act(A::Task)],
            A::Onlinedoc => &[Record, Act(A::Task)],
            A::Photo => &[Act(A::Photolist)],
            A::Task => &[Act(A::Tasklist)],
            A::Timerecord => &[Act(A::Call), Act(A::Task)],
            A::Comment => &[
                Act(A::Opportunity),
                Act(A::File),
                Act(A::Followup),
                Act(A::Onlinedoc),
                Act(A::Call),
                Act(A::Linkedemails),
                Act(A::Note),
                Act(A::Photolist),
                Act(A::Tasklist),
                Act(A::Task),
                Act(A::Website),
                Act(A::Accountingwidget),
                Act(A::Helpdeskwidget),
            ],
            A::Attachment => &[Record, Act(A::Comment)],
        }
    }

    /// Whether a parent may hold only one of this type.
    pub fn one_per_parent(self) -> bool {
        matches!(self, A::Linkedemails)
    }

    /// Tasks and follow-ups cannot be created completed; they are the ones with a due date.
    pub fn is_dated_action(self) -> bool {
        matches!(self, A::Task | A::Followup)
    }

    /// Fields that must be present (and not empty) on create.
    pub fn required_fields(self) -> &'static [&'static str] {
        match self {
            A::Attachment => &["file"],
            _ => &[],
        }
    }

    /// "a task list", "a record or a comment": the allowed parents, for error messages.
    pub fn allowed_parents_text(self) -> String {
        let names: Vec<String> = self
            .allowed_parents()
            .iter()
            .map(|p| match p {
                ParentKind::Record => "a record (contact, company, project blog or ticket)".to_string(),
                ParentKind::Activity(t) => format!("a {}", t.segment()),
            })
            .collect();
        names.join(" or ")
    }

    /// The title (`cn`) of an activity: its first title-like field, first line, else the
    /// type's label.
    pub fn title(self, fields: &FieldValues) -> String {
        for key in ["title", "description", "caption", "details", "post", "url", "file"] {
            if let Some(v) = fields.get(key).filter(|v| !v.trim().is_empty()) {
                let line = v.lines().next().unwrap_or("").trim();
                return line.chars().take(crate::limits::NAME_BYTES_MAX).collect();
            }
        }
        self.label().to_string()
    }

    /// The activity's date, as reports, the calendar and the due filters see it: a task's or
    /// follow-up's `duedate` and a task list's `milestonedate` (unless `nodate` is 1), a deal's
    /// `closingdate`, a time record's `date`, an interaction's day (`dateoccured`).
    pub fn date(self, fields: &FieldValues) -> Option<String> {
        let get = |k: &str| fields.get(k).filter(|v| !v.is_empty()).cloned();
        let undated = fields.get("nodate").is_some_and(|v| v == "1");
        match self {
            A::Task | A::Followup if !undated => get("duedate"),
            A::Tasklist if !undated => get("milestonedate"),
            A::Opportunity => get("closingdate"),
            A::Timerecord => get("date"),
            A::Call => get("dateoccured").map(|v| v.chars().take(10).collect()),
            _ => None,
        }
    }

    /// Whether activities of this type carry an uploaded file (`file` field).
    pub fn holds_file(self) -> bool {
        matches!(self, A::Attachment | A::File | A::Photo)
    }

    pub fn completed(fields: &FieldValues) -> bool {
        fields.get("completed").is_some_and(|v| v == "1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chain_of_the_interface_is_allowed() {
        use ParentKind::{Activity as Act, Record};
        let chains: &[&[ActivityType]] = &[
            &[A::Opportunity, A::Comment],
            &[A::File, A::Comment],
            &[A::Followup, A::Comment],
            &[A::Onlinedoc, A::Comment],
            &[A::Call, A::Comment],
            &[A::Call, A::Timerecord],
            &[A::Linkedemails, A::Comment],
            &[A::Note, A::Comment],
            &[A::Photolist, A::Photo],
            &[A::Photolist, A::Comment],
            &[A::Tasklist, A::Comment],
            &[A::Tasklist, A::Task, A::File, A::Comment],
            &[A::Tasklist, A::Task, A::Onlinedoc, A::Comment],
            &[A::Tasklist, A::Task, A::Comment],
            &[A::Tasklist, A::Task, A::Timerecord],
            &[A::Website, A::Comment],
            &[A::Accountingwidget, A::Comment],
            &[A::Helpdeskwidget, A::Comment],
        ];
        for chain in chains {
            assert!(chain[0].allowed_parents().contains(&Record), "{:?} under a record", chain[0]);
            for pair in chain.windows(2) {
                assert!(pair[1].allowed_parents().contains(&Act(pair[0])), "{:?} under {:?}", pair[1], pair[0]);
            }
        }
        assert!(!A::Task.allowed_parents().contains(&Record));
        assert!(!A::Photo.allowed_parents().contains(&Act(A::Tasklist)));
    }
}
