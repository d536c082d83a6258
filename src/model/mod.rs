//! Core vocabulary: record types and their fields, custom fields, who is asking (`Viewer`).
//!
//! These are plain types: no serde, no SQL. The API layer converts them to XML/JSON and
//! the store to rows, each explicitly.

pub mod activity;
pub mod hook;
pub mod value;

use std::collections::BTreeMap;

use value::choose;
pub use value::{Kind, check_text, looks_like_email, trim_blank, xml_char};

/// Field values of a record or activity, by field name. Only non-empty values are kept.
pub type FieldValues = BTreeMap<String, String>;

/// The four record types. Records and activities share one id space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordType {
    Contact,
    Company,
    ProjectBlog,
    Ticket,
}

impl RecordType {
    pub const ALL: [RecordType; 4] =
        [RecordType::Contact, RecordType::Company, RecordType::ProjectBlog, RecordType::Ticket];

    /// The path segment that selects the type.
    pub fn segment(self) -> &'static str {
        match self {
            RecordType::Contact => "contacts",
            RecordType::Company => "companies",
            RecordType::ProjectBlog => "projectblogs",
            RecordType::Ticket => "tickets",
        }
    }

    /// The type id: 1 contact, 2 project blog, 40 company (the deployed service's), and 50 for
    /// tickets, a number no record or activity type uses.
    pub fn typeid(self) -> i64 {
        match self {
            RecordType::Contact => 1,
            RecordType::ProjectBlog => 2,
            RecordType::Company => 40,
            RecordType::Ticket => 50,
        }
    }

    pub fn from_segment(segment: &str) -> Option<RecordType> {
        RecordType::ALL.into_iter().find(|t| t.segment() == segment)
    }

    pub fn from_typeid(typeid: i64) -> Option<RecordType> {
        RecordType::ALL.into_iter().find(|t| t.typeid() == typeid)
    }

    /// Whether other records may link to this type as a related item.
    pub fn can_be_related(self) -> bool {
        !matches!(self, RecordType::Ticket)
    }

    pub fn builtin_fields(self) -> &'static [BuiltinField] {
        match self {
            RecordType::Contact => CONTACT_FIELDS,
            RecordType::Company => COMPANY_FIELDS,
            RecordType::ProjectBlog => PROJECTBLOG_FIELDS,
            RecordType::Ticket => TICKET_FIELDS,
        }
    }

    /// Fields shown in a list entry with `layout=0`.
    pub fn summary_fields(self) -> &'static [&'static str] {
        match self {
            RecordType::Contact => {
                &["firstname", "lastname", "businessemail", "businessphonedirect", "cellularphone", "assignedto"]
            }
            RecordType::Company => &["name", "phone", "website", "assignedto"],
            RecordType::ProjectBlog => &["title", "assignedto"],
            RecordType::Ticket => &["title", "status", "priority", "assignedto"],
        }
    }

    /// The record's display name, derived from its fields.
    pub fn display_name(self, fields: &FieldValues) -> String {
        let get = |k: &str| fields.get(k).map(String::as_str).unwrap_or("");
        match self {
            RecordType::Contact => {
                let name = format!("{} {}", get("firstname"), get("lastname")).trim().to_string();
                if !name.is_empty() {
                    name
                } else if !get("businessemail").is_empty() {
                    get("businessemail").to_string()
                } else {
                    get("personalemail").to_string()
                }
            }
            RecordType::Company => get("name").to_string(),
            RecordType::ProjectBlog | RecordType::Ticket => get("title").to_string(),
        }
    }
}

#[derive(Debug)]
pub struct BuiltinField {
    pub name: &'static str,
    pub label: &'static str,
    pub kind: Kind,
}

const fn f(name: &'static str, label: &'static str, kind: Kind) -> BuiltinField {
    BuiltinField { name, label, kind }
}

use Kind::{Date, Email, Phone, Text};

static CONTACT_FIELDS: &[BuiltinField] = &[
    f("firstname", "First name", Text),
    f("lastname", "Last name", Text),
    f("businessemail", "Business e-mail", Email),
    f("personalemail", "Personal e-mail", Email),
    f("businessphonedirect", "Business phone (direct)", Phone),
    f("businessphonemain", "Business phone (main)", Phone),
    f("homephone", "Home phone", Phone),
    f("cellularphone", "Cellular phone", Phone),
    f("businessfax", "Business fax", Phone),
    f("businessaddress", "Business address", Text),
    f("jobtitle", "Job title", Text),
    f("background", "Background", Text),
    f("website", "Website", Text),
    f("assignedto", "Assigned to", Kind::Principal),
];

static COMPANY_FIELDS: &[BuiltinField] = &[
    f("name", "Company name", Text),
    f("mainaddress", "Main address", Text),
    f("billingaddress", "Billing address", Text),
    f("shippingaddress", "Shipping address", Text),
    f("phone", "Phone", Phone),
    f("fax", "Fax", Phone),
    f("website", "Website", Text),
    f("background", "Background", Text),
    f("assignedto", "Assigned to", Kind::Principal),
];

static PROJECTBLOG_FIELDS: &[BuiltinField] = &[
    f("title", "Title", Text),
    f("description", "Description", Text),
    f("assignedto", "Assigned to", Kind::Principal),
];

pub const TICKET_STATUSES: &[&str] = &["open", "pending", "resolved", "closed"];
pub const TICKET_PRIORITIES: &[&str] = &["low", "normal", "high", "urgent"];

static TICKET_FIELDS: &[BuiltinField] = &[
    f("title", "Title", Text),
    f("description", "Description", Text),
    f("status", "Status", Kind::Choice(TICKET_STATUSES)),
    f("priority", "Priority", Kind::Choice(TICKET_PRIORITIES)),
    f("requesteremail", "Requester e-mail", Email),
    f("requesterphone", "Requester phone", Phone),
    f("duedate", "Due date", Date),
    f("assignedto", "Assigned to", Kind::Principal),
];

/// Custom field ids; built-in fields have the ids below this range (their place in the type's
/// list, from 1), so a field id alone names a field (`searchmode=C12`).
pub const CUSTOM_FIELD_ID_MIN: i64 = 1000;
pub const CUSTOM_FIELD_ID_MAX: i64 = 999_999_999;

/// A custom field from config.toml (`[[fields]]`), named `custom<id>`.
#[derive(Clone, Debug)]
pub struct CustomField {
    pub id: i64,
    pub label: String,
    pub kind: CustomFieldKind,
    pub options: Vec<String>,
    pub record_types: Vec<RecordType>,
}

impl CustomField {
    pub fn name(&self) -> String {
        format!("custom{}", self.id)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CustomFieldKind {
    Text,
    Select,
    Date,
    Number,
}

impl CustomFieldKind {
    pub fn parse(s: &str) -> Option<CustomFieldKind> {
        Some(match s {
            "text" => CustomFieldKind::Text,
            "select" => CustomFieldKind::Select,
            "date" => CustomFieldKind::Date,
            "number" => CustomFieldKind::Number,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CustomFieldKind::Text => "text",
            CustomFieldKind::Select => "select",
            CustomFieldKind::Date => "date",
            CustomFieldKind::Number => "number",
        }
    }
}

/// One field of a record type, built-in or custom.
#[derive(Clone, Copy, Debug)]
pub enum FieldDef<'a> {
    Builtin(&'static BuiltinField),
    Custom(&'a CustomField),
}

impl<'a> FieldDef<'a> {
    /// The field's id: built-in fields are numbered from 1 in their type's list (which only
    /// ever grows at the end), custom fields have their configured id.
    pub fn id(&self, record_type: RecordType) -> i64 {
        match self {
            FieldDef::Builtin(b) => {
                record_type.builtin_fields().iter().position(|x| std::ptr::eq(x, *b)).map_or(0, |i| i as i64 + 1)
            }
            FieldDef::Custom(c) => c.id,
        }
    }

    pub fn name(&self) -> String {
        self.key().into_owned()
    }

    /// The name, borrowed where it is a built-in field's.
    pub fn key(&self) -> std::borrow::Cow<'static, str> {
        match self {
            FieldDef::Builtin(b) => std::borrow::Cow::Borrowed(b.name),
            FieldDef::Custom(c) => std::borrow::Cow::Owned(c.name()),
        }
    }

    pub fn label(&self) -> &str {
        match self {
            FieldDef::Builtin(b) => b.label,
            FieldDef::Custom(c) => &c.label,
        }
    }

    /// The type shown by List Fields: empty for built-in fields.
    pub fn type_name(&self) -> &'static str {
        match self {
            FieldDef::Builtin(_) => "",
            FieldDef::Custom(c) => c.kind.as_str(),
        }
    }

    pub fn options(&self) -> Vec<String> {
        match self {
            FieldDef::Builtin(BuiltinField { kind: Kind::Choice(o), .. }) => o.iter().map(|s| s.to_string()).collect(),
            FieldDef::Builtin(_) => Vec::new(),
            FieldDef::Custom(c) => c.options.clone(),
        }
    }

    pub fn is_email(&self) -> bool {
        matches!(self, FieldDef::Builtin(BuiltinField { kind: Kind::Email, .. }))
    }

    pub fn is_phone(&self) -> bool {
        matches!(self, FieldDef::Builtin(BuiltinField { kind: Kind::Phone, .. }))
    }

    /// Checks and normalises a value; the empty string clears the field. Principal ids are
    /// checked for existence by the store, here only for form.
    pub fn normalize(&self, value: &str) -> Result<String, String> {
        match self {
            FieldDef::Builtin(b) => b.kind.normalize(value),
            FieldDef::Custom(c) => match c.kind {
                CustomFieldKind::Text => Kind::Text.normalize(value),
                CustomFieldKind::Select => {
                    check_text(value)?;
                    choose(c.options.iter().map(String::as_str), value)
                }
                CustomFieldKind::Date => Kind::Date.normalize(value),
                CustomFieldKind::Number => Kind::Decimal.normalize(value),
            },
        }
    }
}

/// Every field of a record type, built-in first, then the custom fields that apply.
pub fn fields_of(record_type: RecordType, custom: &[CustomField]) -> Vec<FieldDef<'_>> {
    let mut out: Vec<FieldDef<'_>> = record_type.builtin_fields().iter().map(FieldDef::Builtin).collect();
    out.extend(custom.iter().filter(|c| c.record_types.contains(&record_type)).map(FieldDef::Custom));
    out
}

/// Looks up a field of a record type by name (`firstname`, `custom12`).
pub fn field_of<'a>(record_type: RecordType, custom: &'a [CustomField], name: &str) -> Option<FieldDef<'a>> {
    if let Some(b) = record_type.builtin_fields().iter().find(|b| b.name == name) {
        return Some(FieldDef::Builtin(b));
    }
    // Only as Show writes it: `custom01001` or `custom+1001` would be taken for `custom1001`
    // on a write, and a list asked for it would answer an empty value under that name.
    let digits = name.strip_prefix("custom")?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: i64 = digits.parse().ok()?;
    custom.iter().find(|c| c.id == id && c.record_types.contains(&record_type)).map(FieldDef::Custom)
}

/// Looks up a field by id (see [`FieldDef::id`]).
pub fn field_by_id(record_type: RecordType, custom: &[CustomField], id: i64) -> Option<FieldDef<'_>> {
    if id < CUSTOM_FIELD_ID_MIN {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        return record_type.builtin_fields().get(index).map(FieldDef::Builtin);
    }
    custom.iter().find(|c| c.id == id && c.record_types.contains(&record_type)).map(FieldDef::Custom)
}

/// A file sent with a request (multipart/form-data or form data), for a file, photo or
/// attachment activity.
#[derive(Clone, Debug)]
pub struct Upload {
    pub name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// The authenticated user a request acts for.
#[derive(Clone, Debug)]
pub struct Viewer {
    pub user_id: i64,
    pub org: String,
    pub admin: bool,
    pub prevent_private: bool,
    /// Groups the user belongs to.
    pub groups: Vec<i64>,
}

impl Viewer {
    /// Ids that make a record visible to this user: their own and their groups'.
    pub fn owner_ids(&self) -> Vec<i64> {
        let mut ids = Vec::with_capacity(1 + self.groups.len());
        ids.push(self.user_id);
        ids.extend_from_slice(&self.groups);
        ids
    }
}

/// A user or a group, as the ownership list shows them.
#[derive(Clone, Debug)]
pub struct Principal {
    pub id: i64,
    pub kind: PrincipalKind,
    pub org: String,
    pub name: String,
    pub email: String,
    pub admin: bool,
    pub prevent_login: bool,
    pub prevent_private: bool,
    pub deleted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrincipalKind {
    User,
    Group,
}
