from flask import Flask

from fencekit import SyncClient, Task

app = Flask(__name__)
jobs = SyncClient("redis://localhost:6379")  # one per process: every thread shares it


@app.post("/reports/<int:report_id>")
def build_report(report_id: int) -> dict[str, str]:
    return {"jid": jobs.enqueue(Task("reports", "build", {"report_id": report_id}))}
