//! The view of `.git/config` that sandboxes get: no credentials.

use std::path::Path;

use crate::{Git, VcsError};

pub(crate) use belay_record::without_userinfo as strip_userinfo;

pub(crate) async fn write(git: &Git, dest: &Path) -> Result<(), VcsError> {
    let src = git.git_dir().join("config");
    let text = fs_err::read(&src).map_err(|e| VcsError::io("read", &src, e))?;
    let tmp = dest.with_extension("tmp");
    fs_err::write(&tmp, &text).map_err(|e| VcsError::io("write", &tmp, e))?;
    let file = tmp.to_string_lossy().into_owned();
    let list = git
        .run(&["config", "-z", "--file", &file, "--list"])
        .await?;
    let mut unset: Vec<String> = Vec::new();
    let mut rewrite: Vec<(String, Vec<String>)> = Vec::new();
    for entry in list.split('\0').filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
        let lower = key.to_ascii_lowercase();
        let var = lower.rsplit('.').next().unwrap_or("");
        if lower.starts_with("credential.") || var == "extraheader" {
            if !unset.contains(&key.to_string()) {
                unset.push(key.to_string());
            }
        } else if matches!(var, "url" | "pushurl") || lower.starts_with("url.") {
            let clean = strip_userinfo(value);
            match rewrite.iter_mut().find(|(k, _)| k == key) {
                Some((_, vals)) => vals.push(clean.unwrap_or_else(|| value.to_string())),
                None => rewrite.push((
                    key.to_string(),
                    vec![clean.unwrap_or_else(|| value.to_string())],
                )),
            }
        }
    }
    for key in &unset {
        git.run(&["config", "--file", &file, "--unset-all", key])
            .await?;
    }
    for (key, vals) in &rewrite {
        git.run(&["config", "--file", &file, "--unset-all", key])
            .await?;
        for v in vals {
            git.run(&["config", "--file", &file, "--add", key, v])
                .await?;
        }
    }
    // `url.<base>.insteadOf`: the base is the subsection, which may hold
    // credentials too; such sections are dropped whole.
    for entry in list.split('\0').filter(|e| !e.is_empty()) {
        let key = entry.split_once('\n').map(|(k, _)| k).unwrap_or(entry);
        if let Some(base) = key
            .strip_prefix("url.")
            .and_then(|k| k.rsplit_once('.'))
            .map(|(b, _)| b)
        {
            if strip_userinfo(base).is_some() {
                let _ = git
                    .run(&[
                        "config",
                        "--file",
                        &file,
                        "--remove-section",
                        &format!("url.{base}"),
                    ])
                    .await;
            }
        }
    }
    fs_err::rename(&tmp, dest).map_err(|e| VcsError::io("write", dest, e))?;
    Ok(())
}
