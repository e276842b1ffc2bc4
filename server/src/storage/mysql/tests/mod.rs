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
fn sessions_run_in_utc_whatever_the_url_says() {
    // The options have no getter for it; their Debug shows it.
    for url in [
        "mariadb://app@db.internal/shop",
        "mysql://root@localhost/test?timezone=%2B02:00",
    ] {
        let options = format!("{:?}", connect_options(url).unwrap());
        assert!(options.contains(r#"timezone: Some("+00:00")"#), "{options}");
    }
}
