//! The backend's own tests: its statements as rendered (`sql.rs`), what its locking
//! reads keep locked on a real MariaDB (`locks.rs`), and its identifiers and URLs.

mod locks;
mod sql;
use super::*;
use crate::storage::sql_common::assert_names_invalid_identifier;

#[tokio::test]
async fn identifiers_are_checked_and_named() {
    let url = "mysql://root@127.0.0.1:1/none";
    for (options, database, named) in [
        (
            TableOptions {
                table: "out-box".into(),
                ..Default::default()
            },
            None,
            "`table`",
        ),
        (TableOptions::default(), Some("1st".into()), "`schema`"),
    ] {
        let err = MySqlStorage::connect(url, 1, options, database).unwrap_err();
        assert_names_invalid_identifier(&err, named);
    }
}

#[test]
fn mariadb_urls_are_accepted_and_sessions_run_in_utc() {
    let options = connect_options("mariadb://app:secret@db.internal:3307/shop").unwrap();
    assert_eq!(options.get_host(), "db.internal");
    assert_eq!(options.get_port(), 3307);
    assert_eq!(options.get_database(), Some("shop"));
    let options = connect_options("mysql://root@localhost/test?timezone=%2B02:00").unwrap();
    assert_eq!(options.get_database(), Some("test"));
}
