"""The sidebar: the conversation list model, pinned first then newest, and search across every message."""

from app.chats.conversations import Conversations
from app.window.sidebar import ConversationIdRole, ConversationListModel


def test_conversation_list_model_passes_the_model_tester(qtmodeltester, store):
    for title in ("a", "b", "c"):
        store.create_conversation(title)
    conversations = Conversations(store)
    model = ConversationListModel(conversations)
    qtmodeltester.check(model)
    assert [model.index(i).data() for i in range(3)] == ["c", "b", "a"]
    assert model.index(0).data(ConversationIdRole) == store.conversations()[0].id
    conversations.set_pinned(store.conversations()[2].id, True)  # no refresh by hand: the model follows
    assert [model.index(i).data() for i in range(3)] == ["📌 a", "c", "b"]


def test_search_filters_the_sidebar(qtbot, window, qloop, store):
    qloop.run_until_complete(window.send("bananas are yellow"))
    window.actions.new()
    qloop.run_until_complete(window.send("the sky is blue"))
    window.sidebar.search.setText("banana")
    model = window.sidebar.model
    assert [model.index(i).data() for i in range(model.rowCount())] == ["bananas are yellow"]
    window.sidebar.search.setText("")
    assert model.rowCount() == 2
