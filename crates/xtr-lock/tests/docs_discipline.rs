//! House rules that a compiler does not check: every public async method of the library, and
//! every async method of a public trait, documents `# Cancel safety`.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The doc comment lines just above line `i` (attributes skipped).
fn doc_above(lines: &[&str], i: usize) -> String {
    let mut doc = Vec::new();
    for line in lines[..i].iter().rev() {
        let t = line.trim_start();
        if t.starts_with("///") {
            doc.push(t);
        } else if t.starts_with("#[") || t.is_empty() && doc.is_empty() {
            continue;
        } else {
            break;
        }
    }
    doc.join("\n")
}

#[test]
fn every_public_async_method_documents_cancel_safety() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in files {
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        // Scenarios are documented once, at the module level (they are not cancel-safe).
        let scenario_file = rel.starts_with("conformance/") && rel != "conformance/mod.rs";
        let text = fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut in_pub_trait = false;
        for (i, line) in lines.iter().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break; // unit tests follow
            }
            if line.starts_with("pub trait ") {
                in_pub_trait = true;
            } else if line.starts_with('}') {
                in_pub_trait = false;
            }
            let t = line.trim_start();
            let public = t.starts_with("pub async fn ");
            let trait_method = in_pub_trait && t.starts_with("async fn ");
            if !(public || trait_method) || scenario_file {
                continue;
            }
            checked += 1;
            if !doc_above(&lines, i).contains("# Cancel safety") {
                missing.push(format!("src/{rel}:{}: {}", i + 1, t));
            }
        }
    }
    assert!(
        checked > 20,
        "the scan found only {checked} methods: is it still looking?"
    );
    assert!(
        missing.is_empty(),
        "no `# Cancel safety` section:\n{}",
        missing.join("\n")
    );
}
