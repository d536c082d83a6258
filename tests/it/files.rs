//! Files of file, photo and attachment activities: uploads as multipart/form-data and as form
//! data, stored with the activity, downloaded by whoever sees the record.

use crate::support::{BASE_CONFIG, Options, Req, Service, q};

/// A multipart/form-data body: text fields, then one file part.
fn multipart(fields: &[(&str, &str)], file: Option<(&str, &str, &str, &[u8])>) -> (String, Vec<u8>) {
    let boundary = "----sitegate-test-7d3a";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    }
    if let Some((name, file_name, content_type, bytes)) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file_name}\"\r\nContent-Type: {content_type}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Bytes that are not UTF-8 and contain the boundary's first characters and CRLFs.
fn awkward_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| [0u8, 0xff, b'\r', b'\n', b'-', b'-', 0x80, (i % 251) as u8][i % 8]).collect()
}

#[test]
fn upload_show_download_replace() {
    let s = Service::start("upload_show_download_replace");
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let content = awkward_bytes(100_000);
    let (ct, body) = multipart(
        &[("parent", &contact.to_string()), ("data[caption]", "Floor plan")],
        Some(("data[file]", "plan ä.pdf", "application/pdf", &content)),
    );
    let r = c.call(Req::new("POST", "/contacts/file").body(&ct, body).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let v = r.json();
    let id = v["id"].as_i64().unwrap();
    assert_eq!(v["data"]["file"], "plan ä.pdf");
    assert_eq!(v["data"]["caption"], "Floor plan");

    let show = c.get_json(&format!("/contacts/{contact}")).json();
    let a = &show["activities"][id.to_string()];
    assert_eq!(a["fields"]["file"], "plan ä.pdf");
    assert_eq!(a["filesize"], 100_000);
    assert_eq!(a["filetype"], "application/pdf");
    let download = a["download"].as_str().unwrap().to_string();
    assert_eq!(download, format!("/contacts/file/{id}/file"));

    let raw = download_bytes(&s, &s.admin, &download);
    assert_eq!(raw.0, 200);
    assert_eq!(raw.1.len(), content.len());
    assert!(raw.1 == content, "downloaded bytes differ");
    assert!(raw.2.contains("filename*=UTF-8''plan%20%C3%A4%2Epdf"), "{}", raw.2);

    // A new upload replaces the content; a photo in a photo list; an attachment by form data.
    let (ct, body) = multipart(&[], Some(("data[file]", "v2.txt", "text/plain", b"second version")));
    c.call(Req::new("PUT", &format!("/contacts/file/{id}")).body(&ct, body)).assert_status(200);
    let raw = download_bytes(&s, &s.admin, &download);
    assert_eq!(raw.1, b"second version");
    // `file` alone renames the stored file (the download says what Show says); it cannot be
    // emptied. A browser's file input left empty changes the caption only.
    c.put_json(&format!("/contacts/file/{id}"), r#"{"data": {"file": "renamed.txt"}}"#).assert_status(200);
    let raw = download_bytes(&s, &s.admin, &download);
    assert!(raw.2.contains("renamed.txt"), "{}", raw.2);
    assert_eq!(c.put_json(&format!("/contacts/file/{id}"), r#"{"data": {"file": ""}}"#).status, 400);
    let (ct, body) =
        multipart(&[("data[caption]", "New caption")], Some(("data[file]", "", "application/octet-stream", b"")));
    c.call(Req::new("PUT", &format!("/contacts/file/{id}")).body(&ct, body)).assert_status(200);
    let show = c.get_json(&format!("/contacts/{contact}")).json();
    assert_eq!(show["activities"][id.to_string()]["fields"]["caption"], "New caption");
    assert_eq!(download_bytes(&s, &s.admin, &download).1, b"second version");
    let list = c.create_activity("photolist", &format!(r#"{{"parent": {contact}, "data": {{"title": "Lobby"}}}}"#));
    let (ct, body) = multipart(
        &[("parent", &list.to_string())],
        Some(("file", "door.jpg", "image/jpeg", &[0xff, 0xd8, 0xff, 0xe0])),
    );
    let r = c.call(Req::new("POST", "/contacts/photo").body(&ct, body).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let photo = r.json()["id"].as_i64().unwrap();
    assert_eq!(download_bytes(&s, &s.admin, &format!("/contacts/photo/{photo}/file")).1, vec![0xff, 0xd8, 0xff, 0xe0]);
    let form = format!("parent={contact}&data%5Bfile%5D=%00%01%FEab+c%25&data%5Bfilename%5D={}", q("notes.bin"));
    let r = c.call(Req::new("POST", "/contacts/attachment").form_body(&form).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let att = r.json()["id"].as_i64().unwrap();
    assert_eq!(r.json()["data"]["file"], "notes.bin");
    assert_eq!(download_bytes(&s, &s.admin, &format!("/contacts/attachment/{att}/file")).1, b"\x00\x01\xfeab c%");
    // An attachment keeps its required file.
    assert_eq!(c.put_json(&format!("/contacts/attachment/{att}"), r#"{"data": {"file": ""}}"#).status, 400);
}

#[test]
fn files_follow_record_access_and_limits() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nupload_bytes_max = 20000");
    let s = Service::start_with("files_follow_record_access_and_limits", Options { config: &config, env: vec![] });
    let bob = s.add_user("bob@acme.test", "Bob", &[]);
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Private"}"#);
    let (ct, body) =
        multipart(&[("parent", &contact.to_string())], Some(("data[file]", "a.txt", "text/plain", b"secret")));
    let id = c.call(Req::new("POST", "/contacts/attachment").body(&ct, body).json()).json()["id"].as_i64().unwrap();
    let path = format!("/contacts/attachment/{id}/file");
    assert_eq!(download_bytes(&s, &bob, &path).0, 404, "another user downloaded a private file");
    assert_eq!(download_bytes(&s, &s.admin, &path).0, 200);
    // Wrong type in the path, no such file, a type without files, a file on a record.
    assert_eq!(download_bytes(&s, &s.admin, &format!("/contacts/file/{id}/file")).0, 404);
    let note = c.create_activity("note", &format!(r#"{{"parent": {contact}, "data": {{"details": "n"}}}}"#));
    assert_eq!(download_bytes(&s, &s.admin, &format!("/contacts/note/{note}/file")).0, 404);
    let (ct, body) = multipart(&[("parent", &contact.to_string())], Some(("data[file]", "x.txt", "text/plain", b"x")));
    let r = c.call(Req::new("POST", "/contacts/note").body(&ct, body).json());
    assert_eq!(r.status, 400);
    assert!(r.json()["errors"]["invalidvalue"].as_str().unwrap().contains("a note takes no file"));
    let (ct, body) = multipart(&[("firstname", "Ann")], Some(("data[file]", "x.txt", "text/plain", b"x")));
    assert_eq!(c.call(Req::new("POST", "/contacts").body(&ct, body)).status, 400);
    // Over the upload limit: 413, and nothing is stored.
    let (ct, body) = multipart(
        &[("parent", &contact.to_string())],
        Some(("data[file]", "big.bin", "application/octet-stream", &vec![7u8; 30_000])),
    );
    assert_eq!(c.call(Req::new("POST", "/contacts/attachment").body(&ct, body)).status, 413);
    let show = c.get_json(&format!("/contacts/{contact}")).json();
    assert_eq!(show["activities"].as_object().unwrap().len(), 2);
    // A malformed multipart body is a clear 400.
    let r = c.call(
        Req::new("POST", "/contacts/attachment")
            .body("multipart/form-data; boundary=zz", b"--zz\r\nbroken".to_vec())
            .json(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["errors"]["invalidrequest"].is_string());
}

/// Status, body and Content-Disposition of a download.
fn download_bytes(s: &Service, who: &crate::support::Account, path: &str) -> (u16, Vec<u8>, String) {
    let (status, body, headers) = download_with(s, who, path, "");
    let disposition = headers.get("content-disposition").cloned().unwrap_or_default();
    (status, body, disposition)
}

/// A download with `extra` header lines (each ending in CRLF): the status, the body and the
/// headers by lower-cased name.
fn download_with(
    s: &Service,
    who: &crate::support::Account,
    path: &str,
    extra: &str,
) -> (u16, Vec<u8>, std::collections::HashMap<String, String>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream = std::net::TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let auth = crate::support::basic(&who.email, &who.token);
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n{extra}Connection: close\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = std::collections::HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.insert(k.to_ascii_lowercase(), v.trim().to_string());
    }
    let length: usize = headers["content-length"].parse().unwrap();
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).unwrap();
    (status, body, headers)
}

/// A download resumed or read in part: one byte range answers 206 with that range; a range
/// past the end 416 in the API's error shape; several ranges, an `If-Range` or a header that
/// does not parse get the whole file.
#[test]
fn a_file_is_served_by_byte_range() {
    let s = Service::start("a_file_is_served_by_byte_range");
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let content = awkward_bytes(100_000);
    let (ct, body) =
        multipart(&[("parent", &contact.to_string())], Some(("data[file]", "plan.pdf", "application/pdf", &content)));
    let r = c.call(Req::new("POST", "/contacts/file").body(&ct, body).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let path = format!("/contacts/file/{}/file", r.json()["id"].as_i64().unwrap());
    let whole = download_with(&s, &s.admin, &path, "");
    assert_eq!((whole.0, whole.1.len()), (200, content.len()));
    assert_eq!(whole.2["accept-ranges"], "bytes");
    for (range, from, to) in [("bytes=10-19", 10, 20), ("bytes=-5", 99_995, 100_000), ("bytes=99990-", 99_990, 100_000)]
    {
        let (status, body, headers) = download_with(&s, &s.admin, &path, &format!("Range: {range}\r\n"));
        assert_eq!(status, 206, "{range}");
        assert!(body == content[from..to], "{range}: other bytes");
        assert_eq!(headers["content-range"], format!("bytes {from}-{}/100000", to - 1), "{range}");
        assert_eq!(headers["content-type"], "application/pdf");
    }
    // Past the end: an end beyond it is cut to it, a start beyond it is refused.
    let (status, body, _) = download_with(&s, &s.admin, &path, "Range: bytes=99999-200000\r\n");
    assert_eq!((status, body.as_slice()), (206, &content[99_999..]));
    let (status, body, headers) = download_with(&s, &s.admin, &path, "Range: bytes=100000-\r\n");
    assert_eq!(status, 416);
    assert_eq!(headers["content-range"], "bytes */100000");
    let body = String::from_utf8(body).unwrap();
    assert!(body.contains("<rangenotsatisfiable>") && body.contains("<status>failed</status>"), "{body}");
    for extra in [
        "Range: bytes=0-1,5-6\r\n",
        "Range: bytes=abc\r\n",
        "Range: lines=1-2\r\n",
        "Range: bytes=0-9\r\nIf-Range: x\r\n",
    ] {
        let (status, body, _) = download_with(&s, &s.admin, &path, extra);
        assert_eq!((status, body.len()), (200, content.len()), "{extra}");
    }
}

/// A large upload grows the database's write-ahead log; once it is checkpointed the next
/// writes cut the log back to 8 MiB instead of keeping its largest size until a restart.
#[test]
fn the_write_ahead_log_shrinks_after_a_large_upload() {
    let s = Service::start("the_write_ahead_log_shrinks");
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Ann"}"#);
    // The start's own writes done (the retention purges store their clocks), so that none
    // cuts the log back before it is measured.
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    crate::support::wait_for("the start's purges", || {
        let n: i64 = db.query_row("SELECT count(*) FROM purge_clocks", [], |r| r.get(0)).ok()?;
        (n == 2).then_some(())
    });
    drop(db);
    let content = awkward_bytes(14_000_000);
    let (ct, body) = multipart(
        &[("parent", &contact.to_string())],
        Some(("data[file]", "scan.bin", "application/octet-stream", &content)),
    );
    let r = c.call(Req::new("POST", "/contacts/file").body(&ct, body).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let wal = s.dir.join("data/sitegate.db-wal");
    let size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(size() > 14_000_000, "the upload went through the log: {}", size());
    let mut n = 0;
    crate::support::wait_for("the log cut back", || {
        n += 1;
        c.put_json(&format!("/contacts/{contact}"), &format!(r#"{{"lastname": "L{n}"}}"#)).assert_status(200);
        (size() <= 8 * 1024 * 1024).then_some(())
    });
}
