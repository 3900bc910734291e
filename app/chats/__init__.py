"""The chats as the app works on them, without a window: the session, the conversations model, what users
do to chats, the reply flow, where each chat runs and the context meter."""
