//! The demo template and helpers the tests of the template modules share.

use super::{Document, SpecDocument, TemplateDocument, TemplateSpec};

pub(super) const DEMO: &str = r#"
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata:
  namespace: ate-demo
  name: counter
spec:
  containers:
    - name: counter
      image: oci-layout:/var/lib/ate/images/counter:latest
      command: ["/counter"]
      env:
        - name: PORT
          value: "80"
      wakeupProbe:
        httpGet: {path: /healthz, port: 80}
        timeoutSeconds: 10
  resources: {cpu: 250m, memory: 64Mi}
  volumes:
    - name: data
      mountPath: /data
  snapshots: {fidelity: memory}
  idleTimeout: 5m
"#;

pub(super) fn demo() -> TemplateDocument {
    match serde_saphyr::from_str::<Document>(DEMO).unwrap() {
        Document::ActorTemplate(t) => *t,
        other => panic!("unexpected {other:?}"),
    }
}

pub(super) fn with_sidecar(doc: &mut SpecDocument, port: u32) {
    let mut sidecar = doc.containers[0].clone();
    sidecar.name = "sidecar".into();
    if let Some(p) = sidecar.wakeup_probe.as_mut() {
        p.http_get.port = port;
    }
    doc.containers.push(sidecar);
}

pub(super) fn field_of(mutate: impl FnOnce(&mut SpecDocument)) -> Option<String> {
    let mut doc = demo().spec;
    mutate(&mut doc);
    TemplateSpec::from_document(&doc).err().map(|e| {
        // The message never echoes a huge value back.
        assert!(
            e.message.len() < 1000,
            "{} bytes of message",
            e.message.len()
        );
        e.field
    })
}
