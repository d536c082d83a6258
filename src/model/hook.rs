//! Webhooks: their events, content types and the constraint that narrows an event to a record
//! or activity type.

use super::RecordType;
use super::activity::ActivityType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    ItemsCreate,
    ItemsUpdate,
    ItemsDelete,
    ItemsRestore,
    ItemsCategorize,
    ItemsUncategorize,
    ActivitiesCreate,
    ActivitiesUpdate,
    ActivitiesDelete,
    ActivitiesRestore,
    /// An extension: a Warn or Alarm alert was raised (`/alerts`).
    AlertsCreate,
    /// An extension: a Warn or Alarm alert was acknowledged (the first time).
    AlertsAck,
}

impl Event {
    pub const ALL: [Event; 12] = [
        Event::ItemsCategorize,
        Event::ItemsUncategorize,
        Event::ItemsUpdate,
        Event::ItemsCreate,
        Event::ItemsDelete,
        Event::ItemsRestore,
        Event::ActivitiesUpdate,
        Event::ActivitiesCreate,
        Event::ActivitiesDelete,
        Event::ActivitiesRestore,
        Event::AlertsCreate,
        Event::AlertsAck,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::ItemsCreate => "items.create",
            Event::ItemsUpdate => "items.update",
            Event::ItemsDelete => "items.delete",
            Event::ItemsRestore => "items.restore",
            Event::ItemsCategorize => "items.categorize",
            Event::ItemsUncategorize => "items.uncategorize",
            Event::ActivitiesCreate => "activities.create",
            Event::ActivitiesUpdate => "activities.update",
            Event::ActivitiesDelete => "activities.delete",
            Event::ActivitiesRestore => "activities.restore",
            Event::AlertsCreate => "alerts.create",
            Event::AlertsAck => "alerts.ack",
        }
    }

    pub fn parse(s: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == s)
    }

    pub fn is_items(self) -> bool {
        self.as_str().starts_with("items.")
    }

    pub fn is_alerts(self) -> bool {
        self.as_str().starts_with("alerts.")
    }
}

/// How a delivery's body is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContentType {
    Xml,
    Json,
    Form,
}

impl ContentType {
    pub fn parse(s: &str) -> Option<ContentType> {
        match s {
            "xml" => Some(ContentType::Xml),
            "json" => Some(ContentType::Json),
            "form" => Some(ContentType::Form),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContentType::Xml => "xml",
            ContentType::Json => "json",
            ContentType::Form => "form",
        }
    }

    /// The HTTP Content-Type of a delivery.
    pub fn mime(self) -> &'static str {
        match self {
            ContentType::Xml => "application/xml; charset=utf-8",
            ContentType::Json => "application/json; charset=utf-8",
            ContentType::Form => "application/x-www-form-urlencoded",
        }
    }
}

/// Record constraints of `items.*` hooks.
pub const ITEM_CONSTRAINTS: &[&str] = &["all", "contact", "projectblog", "company", "ticket"];

/// Activity constraints of `activities.*` hooks, as the interface names them. Those without an
/// activity type here (event, separator, scheduledemail, billingwidget, campaignwidgetA,
/// campaignwidgetB) are accepted and never match.
pub const ACTIVITY_CONSTRAINTS: &[&str] = &[
    "all",
    "call",
    "comment",
    "file",
    "onlinedoc",
    "linkedemails",
    "note",
    "photo",
    "photolist",
    "task",
    "tasklist",
    "website",
    "event",
    "separator",
    "opportunity",
    "timerecord",
    "scheduledemail",
    "attachmentfile",
    "billingwidget",
    "helpdeskwidget",
    "accountingwidget",
    "campaignwidgetA",
    "campaignwidgetB",
    "followup",
];

/// What changed: a record of a type, or an activity of a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    Record(RecordType),
    Activity(ActivityType),
    Alert,
}

/// Whether a constraint is one the event's family accepts.
pub fn constraint_allowed(event: Event, constraint: &str) -> bool {
    if event.is_alerts() {
        constraint == "all"
    } else if event.is_items() {
        ITEM_CONSTRAINTS.contains(&constraint)
    } else {
        ACTIVITY_CONSTRAINTS.contains(&constraint)
    }
}

/// Whether a hook with this constraint fires for the subject.
pub fn constraint_matches(constraint: &str, subject: Subject) -> bool {
    if constraint == "all" {
        return true;
    }
    match subject {
        Subject::Record(rt) => {
            let name = match rt {
                RecordType::Contact => "contact",
                RecordType::Company => "company",
                RecordType::ProjectBlog => "projectblog",
                RecordType::Ticket => "ticket",
            };
            constraint == name
        }
        Subject::Activity(kind) => {
            let name = if kind == ActivityType::Attachment { "attachmentfile" } else { kind.segment() };
            constraint == name
        }
        Subject::Alert => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints() {
        assert!(constraint_allowed(Event::ItemsCreate, "ticket"));
        assert!(!constraint_allowed(Event::ItemsCreate, "note"));
        assert!(constraint_allowed(Event::ActivitiesDelete, "campaignwidgetA"));
        assert!(constraint_matches("attachmentfile", Subject::Activity(ActivityType::Attachment)));
        assert!(!constraint_matches("note", Subject::Activity(ActivityType::Task)));
        assert!(constraint_matches("all", Subject::Record(RecordType::Ticket)));
        assert!(!constraint_matches("event", Subject::Activity(ActivityType::Call)));
        for e in Event::ALL {
            assert_eq!(Event::parse(e.as_str()), Some(e));
        }
    }
}
