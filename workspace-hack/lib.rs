//! Empty: this package exists for its dependency's features (see its Cargo.toml).
