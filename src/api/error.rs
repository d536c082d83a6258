//! API errors and their HTTP statuses, in one place.
//!
//! An error renders as `<errors><{element}>{message}</{element}></errors>` with
//! `<status>failed</status>`. The element names are the catalogue clients match on:
//!
//! | element | status | when |
//! |---|---|---|
//! | itemisnotfound | 404 | the addressed record or activity does not exist or is not visible |
//! | resourcenotfound | 404 | no such path |
//! | incorrectfield | 400 | a field the record or activity type does not have |
//! | invalidvalue | 400 | a field value of the wrong form |
//! | invalidparameter | 400 | a query parameter out of range or of the wrong form |
//! | invalidrequest | 400 | a body that cannot be parsed |
//! | invalidreference | 400 | the body names a tag, record, user or group that cannot be used |
//! | invalidparent | 400 | an activity may not sit under that parent; the message lists the allowed ones |
//! | authenticationfailed | 401 | missing or wrong credentials, or a disabled user |
//! | accessdenied | 403 | allowed to call, not allowed to do this |
//! | methodnotallowed | 405 | the path exists, the method does not |
//! | requesttimeout | 408 | the body did not arrive in time |
//! | alreadyexists | 409 | a unique name is taken |
//! | limitreached | 409 | a bounded collection is full (webhooks of an organisation, devices) |
//! | requesttoolarge | 413 | the body is over the limit |
//! | replytoolarge | 413 | an answer would hold too many bytes of records, a time-in-zone report too many visits, or a nested one does not fit in the batch reply |
//! | quotaexceeded | 429 | the user's hourly call quota is used up |
//! | internalerror | 500 | a fault of the service; the message carries a reference to the log |
//! | serverbusy | 503 | the service is overloaded or the database is locked; retry |
//! | unavailable | 503 | the service cannot use its database (`/health`) |

use std::borrow::Cow;

use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub element: Cow<'static, str>,
    pub message: String,
    /// Extra response headers (Allow, Retry-After).
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
}

impl ApiError {
    fn new(status: u16, element: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, element: Cow::Borrowed(element), message: message.into(), headers: Vec::new() }
    }

    pub fn item_not_found() -> ApiError {
        ApiError::new(404, "itemisnotfound", "Item is not found")
    }

    pub fn no_such_path(path: &str) -> ApiError {
        ApiError::new(404, "resourcenotfound", format!("No such resource: {path}"))
    }

    /// The deployed service's words exactly, which clients may compare; the field is named
    /// in the `X-Sitegate-Field` header.
    pub fn incorrect_field(name: &str) -> ApiError {
        let mut e = ApiError::new(400, "incorrectfield", "Incorrect field specified");
        e.headers
            .push(("X-Sitegate-Field", Cow::Owned(name.chars().filter(|c| c.is_ascii_graphic()).take(64).collect())));
        e
    }

    pub fn invalid_value(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(400, "invalidvalue", format!("{field}: {message}"))
    }

    pub fn invalid_parameter(name: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(400, "invalidparameter", format!("{name}: {message}"))
    }

    pub fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalidrequest", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            401,
            "authenticationfailed",
            "Authentication failed: send the account e-mail and API token with HTTP Basic",
        )
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "accessdenied", message)
    }

    /// HEAD is answered wherever GET is, so it is listed after it.
    pub fn method_not_allowed(allow: &[&str]) -> ApiError {
        let mut methods: Vec<&str> = Vec::with_capacity(allow.len() + 1);
        for m in allow {
            methods.push(m);
            if *m == "GET" && !allow.contains(&"HEAD") {
                methods.push("HEAD");
            }
        }
        let list = methods.join(", ");
        let mut e = ApiError::new(405, "methodnotallowed", format!("Method not allowed here; allowed: {list}"));
        e.headers.push(("Allow", list.into()));
        e
    }

    /// A file asked for by a byte range that lies past its end (RFC 9110 15.5.17).
    pub fn range_not_satisfiable(length_bytes: usize) -> ApiError {
        let mut e = ApiError::new(
            416,
            "rangenotsatisfiable",
            format!("The range asked for lies past the end of the file ({length_bytes} bytes)"),
        );
        e.headers.push(("Content-Range", format!("bytes */{length_bytes}").into()));
        e
    }

    pub fn request_timeout() -> ApiError {
        ApiError::new(408, "requesttimeout", "The request body did not arrive in time")
    }

    pub fn too_large(limit_bytes: usize) -> ApiError {
        ApiError::new(413, "requesttoolarge", format!("The request body is larger than {limit_bytes} bytes"))
    }

    /// A batch's nested answer left out because the batch reply would pass its limit.
    pub fn reply_too_large(answer_bytes: usize, limit_bytes: usize) -> ApiError {
        ApiError::new(
            413,
            "replytoolarge",
            format!(
                "The request ran, but its answer ({answer_bytes} bytes) does not fit in the batch reply \
                 (at most {limit_bytes} bytes in all); ask for it in a request of its own"
            ),
        )
    }

    /// A time-in-zone report that would read more visits than it may (`LOCATION_REPORT_VISITS_MAX`).
    pub fn report_too_large(visits_max: u32) -> ApiError {
        ApiError::new(
            413,
            "replytoolarge",
            format!("The report would read more than {visits_max} visits: ask for a shorter range, a device or a zone"),
        )
    }

    /// An answer that would read more than its budget of records (`REPLY_DATA_BYTES_MAX`).
    pub fn answer_too_large(limit_bytes: usize) -> ApiError {
        ApiError::new(
            413,
            "replytoolarge",
            format!(
                "The answer would hold more than {limit_bytes} bytes of records and activities; \
                 ask for fewer at a time (limit and start, a narrower range, without itemsdata)"
            ),
        )
    }

    pub fn quota_exceeded(allowed: u32, retry_after_secs: i64) -> ApiError {
        let mut e = ApiError::new(
            429,
            "quotaexceeded",
            format!("The quota of {allowed} API calls per hour is used up; it renews at the top of the hour"),
        );
        e.headers.push(("Retry-After", retry_after_secs.max(1).to_string().into()));
        e
    }

    /// Too many failed logins from the client's address (`[api] login_failures_max`).
    pub fn login_locked(retry_after_secs: u64) -> ApiError {
        let mut e = ApiError::new(
            429,
            "toomanyfailedlogins",
            "Too many failed logins from this address; retry after the time in Retry-After",
        );
        e.headers.push(("Retry-After", retry_after_secs.max(1).to_string().into()));
        e
    }

    pub fn busy() -> ApiError {
        let mut e = ApiError::new(503, "serverbusy", "The service is busy; retry shortly");
        e.headers.push(("Retry-After", "1".into()));
        e
    }

    /// The gateway's disk is full: nothing was written; an operator must make room.
    pub fn storage_full() -> ApiError {
        let mut e =
            ApiError::new(503, "storagefull", "The gateway's storage is full: nothing was written; retry later");
        e.headers.push(("Retry-After", "30".into()));
        e
    }

    pub fn unavailable(cause: &str) -> ApiError {
        ApiError::new(503, "unavailable", format!("The database is not usable: {cause}"))
    }

    /// A fault of the service. The cause goes to the log under a reference the client sees.
    pub fn internal(cause: &str) -> ApiError {
        let mut bytes = [0u8; 4];
        let _ = getrandom::fill(&mut bytes);
        let reference = hex::encode(bytes);
        log::error!("internal error {reference}: {cause}");
        ApiError::new(500, "internalerror", format!("Internal error (reference {reference})"))
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        match err {
            StoreError::NotFound => ApiError::item_not_found(),
            StoreError::BadReference(m) => ApiError::new(400, "invalidreference", m),
            StoreError::Forbidden(m) => ApiError::forbidden(m),
            StoreError::WrongParent(m) => ApiError::new(400, "invalidparent", m),
            StoreError::Duplicate(m) => ApiError::new(409, "alreadyexists", m),
            StoreError::LimitReached(m) => ApiError::new(409, "limitreached", m),
            StoreError::Busy => ApiError::busy(),
            StoreError::StorageFull(_) => ApiError::storage_full(),
            StoreError::Moved(m) => ApiError::unavailable(&m),
            StoreError::TooLarge(limit) => ApiError::answer_too_large(limit),
            StoreError::Stopped(why) => ApiError::new(
                503,
                "serverbusy",
                format!(
                    "The request was stopped: {why}; ask for less at a time (a narrower filter or range, fewer parts)"
                ),
            ),
            StoreError::Internal(m) | StoreError::Unusable(m) => ApiError::internal(&m),
        }
    }
}
