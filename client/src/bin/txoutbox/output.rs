//! Output formats: JSON for scripts, aligned tables for people.

use std::io::Write;

use clap::ValueEnum;

use super::exit::{output_error, CliError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// JSON (one document, or one line per message for `tail`).
    Json,
    /// Aligned columns, for people.
    Table,
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).map_err(|error| output_error(error.into()))?;
    writeln!(out).map_err(output_error)
}

/// Prints rows under `header` with columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(table(header, rows).as_bytes())
        .map_err(output_error)
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["orders.paid".to_owned(), "12".to_owned()],
            vec!["x".to_owned(), "3".to_owned()],
        ];
        assert_eq!(
            table(&["TOPIC", "PENDING"], &rows),
            "TOPIC        PENDING\norders.paid  12\nx            3\n"
        );
    }
}
